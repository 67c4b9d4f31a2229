"""
The graphs a call under a user's FakeTensorMode shows to trackers: copies
that cross module boundaries where their nodes' module stacks change, and
that call their compile-only higher-order ops' kernels. See Note [Trackers
see the compiled run of a fake call] in fake_mode_trackers.py.
"""

import copy
import functools
import sys
from typing import Any, Callable, Optional

import torch
from torch import fx
from torch.fx.graph_module import _get_attr
from torch.utils import _python_dispatch, _pytree as pytree

from .fake_mode_attribution import (
    _cross_module_boundary,
    _forward_inputs,
    _gradient_of_input,
    _GraphCall,
    _observed,
    _only_observes,
    _warn_once,
    attach_to_backward,
)


def runs_under_observers() -> bool:
    """Whether a graph runs under a tracker shown the compiled run."""
    return any(
        _only_observes(mode)
        for mode in _python_dispatch._get_current_dispatch_mode_stack()
    )


@functools.cache
def _kernels_of_compile_only_hops() -> dict[str, Callable[..., Any]]:
    """The higher-order ops only compiled graphs call, by name, to their own kernels."""
    from torch._higher_order_ops.auto_functionalize import (
        auto_functionalized,
        auto_functionalized_v2,
    )
    from torch._higher_order_ops.effects import with_effects
    from torch._higher_order_ops.invoke_subgraph import invoke_subgraph

    kernels = {
        hop.name(): hop.py_kernels[torch._C.DispatchKey.CompositeExplicitAutograd]
        for hop in (auto_functionalized, auto_functionalized_v2, with_effects)
    }
    # Its kernel calls the subgraph, asserting that no mode is active.
    kernels[invoke_subgraph.name()] = _call_subgraph
    return kernels


def _call_subgraph(subgraph: Any, identifier: Any, *operands: Any) -> Any:
    if getattr(subgraph, "_boxed_call", False):
        return subgraph(list(operands))
    return subgraph(*operands)


def _call_kernel(hop_name: str, *args: Any, **kwargs: Any) -> Any:
    # One may call another (auto_functionalized_v2 of an invoke_subgraph).
    with _CompileOnlyHops():
        return _kernels_of_compile_only_hops()[hop_name](*args, **kwargs)


class _CompileOnlyHops(_python_dispatch.TorchDispatchMode):
    """Runs the higher-order ops only compiled graphs call through their
    kernels; other ops go on to the modes below."""

    supports_higher_order_operators = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kernel = None
        if isinstance(func, torch._ops.HigherOrderOperator):
            kernel = _kernels_of_compile_only_hops().get(func.name())
        if kernel is None:
            return func(*args, **(kwargs or {}))
        with self:
            return kernel(*args, **(kwargs or {}))


def _calls_pointwise_prim(node: fx.Node) -> bool:
    """
    Whether node calls a pointwise prim (prims.fma, Dynamo's addcmul_):
    the kernel the real run calls checks its meta function, which allocates
    its output, then runs its reference implementation in ATen ops, which
    allocate their own; a FakeTensor runs the meta function only.
    """
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and target.namespace == "prims"
        and torch.Tag.pointwise in target.tags
        and callable(getattr(target, "prim_impl", None))
    )


def _call_prims_kernel(prim: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    # Where autograd records the op, the prim itself: its reference
    # implementation's ops would save other tensors.
    if torch.is_grad_enabled() and any(
        isinstance(a, torch.Tensor) and a.requires_grad
        for a in pytree.tree_leaves((args, kwargs))
    ):
        return prim(*args, **kwargs)
    return prim.prim_impl(*args, **kwargs)


def module_stacks(gm: fx.GraphModule) -> dict[str, Optional[dict[str, Any]]]:
    """Each node's module stack, by name (see _module_stack)."""
    return {node.name: _module_stack(node) for node in gm.graph.nodes}


def _module_stack(node: fx.Node) -> Optional[dict[str, Any]]:
    """
    The modules (key: (path, type), outermost first) whose forward node is
    the op: a forward node's nn_module_stack, a backward node's
    fwd_nn_module_stack; None if the node does not say.
    """
    for name in ("nn_module_stack", "fwd_nn_module_stack"):
        stack = node.meta.get(name)
        if stack is not None:
            return stack
    return None


def graph_for_observers(
    gm: fx.GraphModule,
    stacks: Optional[dict[str, Optional[dict[str, Any]]]] = None,
    prims_kernels: bool = True,
) -> Optional[fx.GraphModule]:
    """
    A copy of gm shown to trackers: it crosses module boundaries where its
    nodes' module stacks change (stacks: by node name, else the nodes'
    metadata), and the higher-order ops only compiled graphs call (in gm and
    the subgraphs it calls) and (prims_kernels) pointwise prims call their
    kernels instead, as the real run of the graph does. None when gm has
    none of them. See Note [Trackers see the compiled run of a fake call]. Graphs
    are copied; tensors and other attributes are shared.
    """
    kernels = _kernels_of_compile_only_hops()
    copies: dict[int, Optional[fx.GraphModule]] = {}

    def calls_compile_only_hop(node: fx.Node) -> bool:
        return (
            node.op == "call_function"
            and isinstance(node.target, torch._ops.HigherOrderOperator)
            and node.target.name() in kernels
        )

    def rewritten(module: fx.GraphModule, top: bool) -> Optional[fx.GraphModule]:
        if id(module) in copies:
            return copies[id(module)]
        subgraphs = {}
        for node in module.graph.nodes:
            if node.op == "get_attr":
                attr = _get_attr(module, node.target)
                if not isinstance(attr, fx.GraphModule):
                    continue
                if any(_module_stack(n) for n in attr.graph.nodes):
                    _warn_once(
                        "Trackers shown a compiled call under a FakeTensorMode: "
                        "modules inside a higher-order op's subgraph "
                        "(nested_compile_region, activation checkpointing with "
                        "the eager backend) are counted in the module around "
                        "its call"
                    )
                if sub := rewritten(attr, False):
                    subgraphs[node.target] = sub
        graph = copy.deepcopy(module.graph)
        crosses = top and _add_module_boundaries(
            graph, stacks or {node.name: _module_stack(node) for node in module.graph.nodes}
        )
        # An AOTAutograd graph pair either crosses a module boundary in both
        # graphs or in neither: the bookings pair up.
        if crosses and stacks is None:
            _add_gradient_bookings(graph)
        observed = None
        prims = [n for n in graph.nodes if prims_kernels and _calls_pointwise_prim(n)]
        if crosses or subgraphs or prims or any(map(calls_compile_only_hop, graph.nodes)):
            observed = fx.GraphModule(module, graph)
            for target, sub in subgraphs.items():
                observed.add_submodule(target, sub)
            for node in filter(calls_compile_only_hop, observed.graph.nodes):
                node.args = (node.target.name(), *node.args)
                node.target = _call_kernel
            for node in observed.graph.nodes:
                if prims_kernels and _calls_pointwise_prim(node):
                    node.args = (node.target, *node.args)
                    node.target = _call_prims_kernel
            observed.recompile()
        copies[id(module)] = observed
        return observed

    return rewritten(gm, True)


def _add_module_boundaries(
    graph: fx.Graph, stacks: dict[str, Optional[dict[str, Any]]]
) -> bool:
    """
    Calls _cross_module_boundary before each node whose module stack differs
    from the last one's (a node that does not say keeps it), and before the
    output: the modules left (innermost first) with the region's values used
    after it, the modules entered (outermost first) with the values the
    region uses from before it. Whether it added any.
    """
    nodes = list(graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    # AOTAutograd's backward graphs take tangents.
    backward_graph = any(
        node.op == "placeholder" and node.name.startswith("tangents") for node in nodes
    )
    # Per module region: (key, first node index, end index).
    crossings: list[tuple[int, list[str], list[str]]] = []
    regions: dict[tuple[str, int], int] = {}
    entered: list[tuple[str, int]] = []
    for i, node in enumerate(nodes):
        if node.op in ("placeholder", "get_attr"):
            continue
        if node.op == "output":
            keys: list[str] = []
        else:
            stack = stacks.get(node.name)
            if stack is None:
                continue
            keys = list(stack)
        common = 0
        while (
            common < min(len(entered), len(keys)) and entered[common][0] == keys[common]
        ):
            common += 1
        if common == len(entered) == len(keys):
            continue
        left = [key for key, _ in reversed(entered[common:])]
        for region in entered[common:]:
            regions[region] = i
        entered = entered[:common] + [(key, i) for key in keys[common:]]
        crossings.append((i, left, keys[common:]))
    if not crossings:
        return False
    starts = {i: [] for i, _, _ in crossings}
    for (key, start), end in regions.items():
        starts[start].append((key, end))

    def used_from_before(start: int, end: int) -> tuple[fx.Node, ...]:
        return tuple(
            dict.fromkeys(
                arg
                for node in nodes[start:end]
                for arg in node.all_input_nodes
                if position[arg] < start
            )
        )

    def used_after(start: int, end: int) -> tuple[fx.Node, ...]:
        return tuple(
            node
            for node in nodes[start:end]
            if any(position[user] >= end for user in node.users if user in position)
        )

    ends = {}
    for (key, start), end in regions.items():
        ends[(key, end)] = used_after(start, end)
    for i, left, keys in crossings:
        region_ends = dict(starts[i])
        with graph.inserting_before(nodes[i]):
            graph.call_function(
                _cross_module_boundary,
                (
                    tuple((key, ends[(key, i)]) for key in left),
                    tuple(
                        (key, used_from_before(i, region_ends[key])) for key in keys
                    ),
                    backward_graph,
                ),
            )
    return True


def _add_gradient_bookings(graph: fx.Graph) -> None:
    """
    In an AOTAutograd backward graph (it takes tangents), calls
    _gradient_of_input after each node that makes the gradient of a forward
    input; in its forward graph, _forward_inputs first.
    """
    placeholders = list(graph.find_nodes(op="placeholder"))
    if not any(node.name.startswith("tangents") for node in placeholders):
        if placeholders:
            with graph.inserting_after(placeholders[-1]):
                graph.call_function(_forward_inputs, tuple(placeholders))
        return
    (output,) = graph.find_nodes(op="output")
    grads = list(output.args[0] or ())
    for index, grad in enumerate(grads):
        if isinstance(grad, fx.Node):
            after = placeholders[-1] if grad.op == "placeholder" else grad
            with graph.inserting_after(after):
                graph.call_function(_gradient_of_input, (index, len(grads), grad))


def module_paths(stacks: dict[str, Optional[dict[str, Any]]]) -> dict[str, str]:
    """The path (a Dynamo source name) of each module the stacks name, by key."""
    return {
        key: entry[0]
        for stack in stacks.values()
        if stack
        for key, entry in stack.items()
    }


class ObservedRuns:
    """
    How a graph Dynamo compiled for fake calls (gm) runs in calls shown to
    trackers: with the modules of the call, resolved in the locals and
    globals of the frame running code (the compiled frame's code, which
    calls the graph), for its forward graphs on this thread and, on the
    autograd nodes of its outputs, for its backward graphs.
    """

    def __init__(self, gm: fx.GraphModule) -> None:
        self.stacks = module_stacks(gm)
        self.paths = module_paths(self.stacks)
        self.code: Any = None
        self.captured: Optional[fx.GraphModule] = None

    def graph_call(self) -> Optional[_GraphCall]:
        """The modules of this call, if it is shown to trackers."""
        if not _observed.depth or not self.paths or self.code is None:
            return None
        code = self.code
        frame = sys._getframe(1)
        for _ in range(16):
            if frame is None:
                break
            if (
                frame.f_code.co_name == code.co_name
                and frame.f_code.co_filename == code.co_filename
                and frame.f_code.co_firstlineno == code.co_firstlineno
            ):
                return _GraphCall(self.paths, {"L": frame.f_locals, "G": frame.f_globals})
            frame = frame.f_back
        _warn_once(
            "Trackers shown a compiled call under a FakeTensorMode: the frame of "
            "a compiled graph could not be found, its modules are not attributed"
        )
        return None

    def run(self, call: _GraphCall, fn: Callable[..., Any], args: Any, captured: bool) -> Any:
        """fn(*args): the backend's graphs, or (captured) Dynamo's graph op by op."""
        if captured:
            if self.captured is None:
                self.captured = graph_for_observers(fn, self.stacks) or fn
            fn = self.captured
        _observed.graph_calls.append(call)
        try:
            outputs = fn(*args) if not captured else fn.forward(*args)
        finally:
            _observed.graph_calls.pop()
        attach_to_backward(call, outputs)
        return outputs
