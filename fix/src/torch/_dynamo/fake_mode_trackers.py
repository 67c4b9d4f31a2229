"""
Trackers (dispatch modes that only observe) around compiled code called under
a user's FakeTensorMode see the compiled run, attributed to modules as eager
attributes it, from the graphs' own metadata. See Note [Trackers see the
compiled run of a fake call].
"""

import copy
import functools
import logging
import re
import sys
import threading
import warnings
import weakref
from typing import Any, Callable, Optional

import torch
from torch import fx
from torch.autograd.graph import register_multi_grad_hook
from torch.fx.graph_module import _get_attr
from torch.utils import _python_dispatch, _pytree as pytree

from . import fake_mode_compat, fake_mode_guards
from .ambient_fake_mode import tracer_owns_call, users_fake_mode
from .types import ConvertFrameReturn, FrameAction, FrameExecStrategy


log = logging.getLogger(__name__)
_logged = False


def frames_run_eagerly_under_modes() -> bool:
    """
    Whether a fullgraph=True call that compiled no frame ran them eagerly on
    purpose: under a user's FakeTensorMode, a dispatch mode that may change
    results (or that this code cannot show the compiled run) makes Dynamo
    skip frames, which run eagerly under the modes, as on stock. That eager
    run is what the call is for (an estimate): fullgraph=True does not fail
    with "found no compiled frames" for it.
    """
    if (
        users_fake_mode() is None
        or not fake_mode_compat.dynamo_skips_for_dispatch_mode()
    ):
        return False
    global _logged
    if not _logged:
        _logged = True
        log.info(
            "fullgraph=True under a FakeTensorMode: frames a dispatch mode makes "
            "Dynamo skip ran eagerly under the modes instead of failing"
        )
    return True


# Note [Trackers see the compiled run of a fake call]
# A call under a user's FakeTensorMode is an estimate of the compiled run, and
# people make it under trackers: FlopCounterMode, MemTracker. Their tables
# are per module: a module tracker (ModuleTracker, ModTracker) learns which
# module runs from global module forward hooks and from gradient hooks on the
# modules' inputs and outputs. Dynamo skips frames under a dispatch mode, and
# cannot trace those hooks anyway. These modes declare that they only observe
# (_only_observes, on the class implementing __torch_dispatch__). Under a
# user's FakeTensorMode, when every mode on the stack only observes or
# ignores compile internals, and every global forward hook is a module
# tracker's, a call of compiled code is made on its own cache entries
# (FakeCallsCallback(observed=True)) and, on this thread only, for its
# duration (shows_compiled_run()):
# - the trackers ignore compile internals (their ignore_compile_internals):
#   Dynamo compiles the frames with the modes off, as for any such mode, and
#   the graphs the backend builds run under them;
# - Dynamo traces as if no global forward hook were registered
#   (hidden_from_tracing, read by VariableTracker.build): the module
#   trackers' hooks are neither traced nor guarded on. Hooks that run
#   outside Dynamo (the compiled module's own call, Module._call_impl, which
#   Dynamo skips; frames after a graph break) fire as in eager.
# The graphs say which module each op comes from: a forward node's
# nn_module_stack, a backward node's fwd_nn_module_stack (AOTAutograd copies
# it by seq_nr), a recomputed node's own. The graphs shown to trackers cross
# module boundaries where that stack changes (graph_for_observers): the
# module trackers on this thread's mode stack enter and leave the modules,
# resolved to the module objects of this call (_GraphCall, from the compiled
# frame's locals and globals; the backward finds its call on its autograd
# node). So FlopCounterMode and MemTracker build eager's rows with the
# compiled run's figures: what the forward saves (MemTracker's activations),
# what the backward recomputes, attributed to the module whose op it is;
# MemTracker books parameters, buffers and gradients per module as in eager
# (its module pre-hook tracks them and hooks the gradients).
# Compilation also puts higher-order ops where eager calls ops
# (invoke_subgraph for nested_compile_region, auto_functionalized for ops
# that mutate inputs, with_effects for effectful ops); trackers have no rule
# for them, so graphs shown to trackers call those ops' own implementation
# (their CompositeExplicitAutograd kernel) and the trackers see the ops
# inside. Other modes (which may change what ops return, or whose module
# tracking this code does not drive: CommDebugMode's backward hooks), global
# backward hooks, global forward hooks that are not a module tracker's, calls
# that compile nothing (set_stance("force_eager")) and calls without a user's
# FakeTensorMode keep the frames skipped, as on stock: the frames run
# eagerly under the modes, with one warning saying why.


class _ObservedCalls(threading.local):
    # Fake calls shown to trackers this thread is in.
    depth = 0

    def __init__(self) -> None:
        # The forward graph calls running on this thread (see _GraphCall).
        self.graph_calls: list["_GraphCall"] = []


_observed = _ObservedCalls()


def shows_compiled_run() -> bool:
    """
    Whether this thread is in a fake call that shows trackers the compiled
    run: the trackers' ignore_compile_internals() while it is.
    """
    return _observed.depth > 0


def callback_for_observed_calls(fn: Callable[..., Any], callback: Any) -> Any:
    """
    The callback for a call of compiled fn under a user's FakeTensorMode
    (callback, made by callback_for_fake_calls): one for calls shown to
    trackers, if the modes on the stack allow it (see Note [Trackers see the
    compiled run of a fake call]).
    """
    why = _why_not_shown(fn)
    if why is None:
        return ObservedCallsCallback(callback.callback)
    if why:
        _warn_once(why)
    return callback


class ObservedCallsCallback(fake_mode_guards.FakeCallsCallback):
    """
    Compiles as FakeCallsCallback, on entries of calls shown to trackers. The
    trackers' own code (their module hooks, which modules called outside
    Dynamo's graphs fire, and their optimizer hooks) runs eagerly, with all
    it calls: it is their bookkeeping, not the model's.
    """

    def __init__(self, callback: Any) -> None:
        super().__init__(callback, observed=True)

    def __call__(self, frame: Any, cache_entry: Any, *args: Any, **kwargs: Any) -> Any:
        caller, files = frame, _tracker_files()
        for _ in range(8):
            if caller is None:
                break
            if caller.f_code.co_filename in files:
                return ConvertFrameReturn(
                    frame_exec_strategy=FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP),
                    apply_to_code=False,
                )
            caller = caller.f_back
        return super().__call__(frame, cache_entry, *args, **kwargs)


def _tracker_files() -> set[str]:
    return {
        sys.modules[name].__file__
        for name in (
            "torch.utils.module_tracker",
            "torch.utils.flop_counter",
            "torch.distributed._tools.mod_tracker",
            "torch.distributed._tools.mem_tracker",
            "torch.distributed._tools.fsdp2_mem_tracker",
        )
        if name in sys.modules
    }


def _why_not_shown(fn: Callable[..., Any]) -> Optional[str]:
    """None if the call can show the modes the compiled run, else why not
    ('' when no mode would want it)."""
    if _observed.depth:
        # A call inside one shown to the trackers.
        return None
    modes = [
        mode
        for mode in _python_dispatch._get_current_dispatch_mode_stack()
        if not mode.is_infra_mode() and not type(mode).ignore_compile_internals()
    ]
    if not modes:
        return ""
    for mode in modes:
        if not _only_observes(mode):
            return f"{type(mode).__name__} may change what ops return, or tracks modules in a way this code does not drive"
    hooks = torch.nn.modules.module
    if hooks._global_backward_pre_hooks or hooks._global_backward_hooks:
        return "a global module backward hook is registered"
    for hook in (
        *hooks._global_forward_pre_hooks.values(),
        *hooks._global_forward_hooks.values(),
    ):
        if _module_tracker_of_hook(hook) is None:
            return f"the global module forward hook {hook!r} may change results"
    return None


@functools.cache
def _warn_once(why: str) -> None:
    warnings.warn(
        "A compiled call under a FakeTensorMode and a dispatch mode runs eagerly "
        f"under the modes, as on stock (the modes see eager's run): {why}",
        stacklevel=3,
    )


def _module_tracker_of_hook(hook: Callable[..., Any]) -> Optional[Any]:
    """The module tracker (ModuleTracker, ModTracker: they record which
    module runs, and change nothing) whose method hook is, if any."""
    owner = getattr(hook, "__self__", None)
    return owner if type(owner) in _module_tracker_types() else None


def _module_tracker_types() -> tuple[type, ...]:
    # Exactly these: a subclass may change results. Not imported: none of
    # their hooks is registered.
    return tuple(
        getattr(sys.modules[name], cls)
        for name, cls in (
            ("torch.utils.module_tracker", "ModuleTracker"),
            ("torch.distributed._tools.mod_tracker", "ModTracker"),
        )
        if name in sys.modules
    )


def _only_observes(mode: Any) -> bool:
    """
    Whether the class that implements mode's __torch_dispatch__ declares that
    it only observes: a subclass that overrides __torch_dispatch__ declares
    it again, or it may change results.
    """
    for cls in type(mode).__mro__:
        if "__torch_dispatch__" in cls.__dict__:
            return cls.__dict__.get("_only_observes", False) is True
    return False


def call_observed(fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """fn(*args, **kwargs), shown to the trackers on this thread's stack."""
    # The compiled module enters here, as its hooks would in eager, for the
    # module trackers that do not see it: all of them where Dynamo traces
    # its call (external_utils.wrap_inline, for modules it would skip),
    # ModTracker inside torch.compile(module) (its hooks return early there).
    # The modules inside enter from the graphs.
    module = _module_of(fn)
    trackers = []
    if module is not None:
        inlined = hasattr(fn, "__wrapped__")
        in_optimized_module = torch._dynamo.eval_frame._is_in_optimized_module()
        trackers = [
            t
            for t in _module_trackers()
            if inlined or (in_optimized_module and hasattr(t, "_user_pre_fw_hook"))
        ]
    hooks = torch.is_grad_enabled()
    for tracker in trackers:
        _enter(tracker, module, False, hooks, args)
    _observed.depth += 1
    try:
        result = fn(*args, **kwargs)
    finally:
        _observed.depth -= 1
    outputs = tuple(pytree.tree_leaves(result))
    for tracker in reversed(trackers):
        _leave(tracker, module, False, hooks, outputs)
    return result


def _module_of(fn: Callable[..., Any]) -> Optional[torch.nn.Module]:
    """The module whose call fn is (torch.compile(module) compiles its
    __call__, through external_utils.wrap_inline for modules Dynamo skips)."""
    fn = getattr(fn, "__wrapped__", fn)
    if isinstance(fn, torch.nn.Module):
        return fn
    module = getattr(fn, "__self__", None)
    if isinstance(module, torch.nn.Module) and getattr(fn, "__func__", None) in (
        torch.nn.Module._call_impl,
        torch.nn.Module._wrapped_call_impl,
    ):
        return module
    return None


def skips_module_call(tracker: Any, module: Any) -> bool:
    """
    Whether a module tracker does not count a call of module on this thread
    as a module running: a call of a graph's own subgraph by a graph shown to
    trackers; inside a fake call shown to trackers, a tracer's call (Dynamo
    compiling, AOTAutograd or make_fx tracing graph modules), or any call if
    the tracker is not one of this thread's (its hooks are global).
    """
    if isinstance(module, fx.GraphModule) and _current_graph_call() is not None:
        return True
    if not _observed.depth:
        return False
    return tracer_owns_call() or all(t is not tracker for t in _module_trackers())


def hidden_from_tracing(value: Any) -> bool:
    """Whether Dynamo traces value, a global forward hook dict, as empty."""
    if not _observed.depth:
        return False
    hooks = torch.nn.modules.module
    return any(
        value is hook_dict
        for hook_dict in (
            hooks._global_forward_pre_hooks,
            hooks._global_forward_hooks,
            hooks._global_forward_hooks_with_kwargs,
            hooks._global_forward_hooks_always_called,
        )
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
    gm: fx.GraphModule, stacks: Optional[dict[str, Optional[dict[str, Any]]]] = None
) -> Optional[fx.GraphModule]:
    """
    A copy of gm shown to trackers: it crosses module boundaries where its
    nodes' module stacks change (stacks: by node name, else the nodes'
    metadata), and the higher-order ops only compiled graphs call (in gm and
    the subgraphs it calls) call their kernels instead. None when gm has
    neither. See Note [Trackers see the compiled run of a fake call]. Graphs
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
                if isinstance(attr, fx.GraphModule) and (sub := rewritten(attr, False)):
                    subgraphs[node.target] = sub
        graph = copy.deepcopy(module.graph)
        crosses = top and _add_module_boundaries(
            graph, stacks or {node.name: _module_stack(node) for node in module.graph.nodes}
        )
        if crosses and stacks is None:
            _add_gradient_bookings(graph)
        observed = None
        if crosses or subgraphs or any(map(calls_compile_only_hop, graph.nodes)):
            observed = fx.GraphModule(module, graph)
            for target, sub in subgraphs.items():
                observed.add_submodule(target, sub)
            for node in filter(calls_compile_only_hop, observed.graph.nodes):
                node.args = (node.target.name(), *node.args)
                node.target = _call_kernel
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
    for index, grad in enumerate(fx.node.map_arg(output.args[0], lambda n: n) or ()):
        if isinstance(grad, fx.Node):
            after = placeholders[-1] if grad.op == "placeholder" else grad
            with graph.inserting_after(after):
                graph.call_function(_gradient_of_input, (index, grad))


def _forward_inputs(*inputs: Any) -> None:
    """Which inputs of the forward graph are parameters, for its backward."""
    if _observed.graph_calls:
        _observed.graph_calls[-1].parameters = {
            i: weakref.ref(t)
            for i, t in enumerate(inputs)
            if isinstance(t, torch.nn.Parameter)
        }


def _gradient_of_input(index: int, grad: Any) -> None:
    """
    A backward graph made the gradient of its forward's input index: a
    MemTracker that hooked the gradients of that parameter books it as a
    gradient, as its gradient hook does in eager.
    """
    call = _current_graph_call()
    if call is None or not isinstance(grad, torch.Tensor):
        return
    param = call.parameters.get(index)
    param = param() if param is not None else None
    # AccumulateGrad copies a gradient whose strides are not its
    # parameter's: that one stays a temporary.
    if param is None or grad.stride() != param.stride():
        return
    for mode in _python_dispatch._get_current_dispatch_mode_stack():
        handles = getattr(mode, "_param_to_grad_hook_handles", None)
        if _only_observes(mode) and handles is not None and param in handles:
            from torch.distributed._tools.mem_tracker import _MemRefType

            mode._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)


_PATH = re.compile(r"(L|G)\[(['\"])(.+?)\2\]")
_STEP = re.compile(r"\.(\w+)|\[(\d+)\]|\[(['\"])(.+?)\3\]")


def module_paths(stacks: dict[str, Optional[dict[str, Any]]]) -> dict[str, str]:
    """The path (a Dynamo source name) of each module the stacks name, by key."""
    return {
        key: entry[0]
        for stack in stacks.values()
        if stack
        for key, entry in stack.items()
    }


class _GraphCall:
    """
    The modules one call of a compiled frame's graphs runs, by the key its
    graphs' module stacks name them by (weakly: the backward finds them on
    its autograd node).
    """

    def __init__(self, paths: dict[str, str], scope: dict[str, dict[str, Any]]) -> None:
        self.modules: dict[str, Any] = {}
        self.roots: list[Any] = []
        # The forward graph's inputs that are parameters, by position.
        self.parameters: dict[int, Any] = {}
        for key, path in paths.items():
            module = _resolve(path, scope)
            if module is None:
                _warn_once(
                    f"the module {path} of a compiled graph could not be found: "
                    "its ops are attributed to the modules around it"
                )
                continue
            self.modules[key] = weakref.ref(module)
            root = _resolve(_PATH.match(path).group(0), scope)  # type: ignore[union-attr]
            if isinstance(root, torch.nn.Module) and all(r() is not root for r in self.roots):
                self.roots.append(weakref.ref(root))

    def module(self, key: str) -> Optional[torch.nn.Module]:
        ref = self.modules.get(key)
        return ref() if ref is not None else None


def _resolve(path: str, scope: dict[str, dict[str, Any]]) -> Optional[Any]:
    """The module at path (L['self'].layers[0].mlp) in the frame's scope."""
    match = _PATH.match(path)
    if match is None:
        return None
    names = scope[match.group(1)]
    if match.group(3) not in names:
        return None
    obj = names[match.group(3)]
    rest = path[match.end() :]
    while rest:
        step = _STEP.match(rest)
        if step is None:
            return None
        attr, index, _, key = step.groups()
        try:
            if attr is not None:
                obj = getattr(obj, attr)
            elif index is not None:
                obj = obj[int(index)]
            else:
                obj = obj[key]
        except (AttributeError, IndexError, KeyError, TypeError):
            return None
        rest = rest[step.end() :]
    return obj if isinstance(obj, torch.nn.Module) else None


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
        _warn_once("the frame of a compiled graph could not be found: its modules are not attributed")
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
        pending = [
            out.grad_fn
            for out in (outputs if isinstance(outputs, (list, tuple)) else [outputs])
            if isinstance(out, torch.Tensor) and out.grad_fn is not None
        ]
        seen = set()
        # AOTAutograd's node for the backend's backward graphs: the outputs'
        # own, or one below the nodes of views of them.
        for _ in range(3):
            following = []
            for node in pending:
                if node is None or id(node) in seen:
                    continue
                seen.add(id(node))
                if "CompiledFunction" in type(node).__name__:
                    node.metadata[_GRAPH_CALL] = call
                else:
                    following += [fn for fn, _ in node.next_functions]
            pending = following
        return outputs


_GRAPH_CALL = "torch._dynamo.fake_mode_trackers.graph_call"


def _current_graph_call() -> Optional[_GraphCall]:
    node = torch._C._current_autograd_node()
    if node is not None and (call := node.metadata.get(_GRAPH_CALL)) is not None:
        return call
    return _observed.graph_calls[-1] if _observed.graph_calls else None


def _cross_module_boundary(
    left: tuple[tuple[str, tuple[Any, ...]], ...],
    entered: tuple[tuple[str, tuple[Any, ...]], ...],
) -> None:
    """
    The module trackers on this thread's mode stack leave and enter modules
    of the call running the graph, as module hooks and gradient hooks make
    them in eager (see Note [Trackers see the compiled run of a fake call]).
    """
    call = _current_graph_call()
    if call is None:
        return
    trackers = _module_trackers()
    if not trackers:
        return
    backward = torch._C._current_graph_task_id() != -1
    # A graph run op by op under autograd (the eager backend's): its
    # gradient hooks, as in eager, mark the backward's modules.
    hooks = torch.is_grad_enabled() and not backward
    for key, outputs in left:
        if (module := call.module(key)) is not None:
            for tracker in reversed(trackers):
                _leave(tracker, module, backward, hooks, _activations(outputs))
    for key, inputs in entered:
        if (module := call.module(key)) is not None:
            inputs = _activations(inputs)
            for tracker in trackers:
                for root in call.roots:
                    # Names the modules below it as eager does.
                    if (root := root()) is not None:
                        tracker._get_mod_name(root)
                _enter(tracker, module, backward, hooks, inputs)


def _module_trackers() -> list[Any]:
    """The module trackers of the trackers on this thread's mode stack."""
    return [
        tracker
        for mode in _python_dispatch._get_current_dispatch_mode_stack()
        if _only_observes(mode) and (tracker := _module_tracker_of(mode)) is not None
    ]


def _module_tracker_of(mode: Any) -> Optional[Any]:
    """The module tracker a tracker attributes by (FlopCounterMode's, MemTracker's)."""
    tracker = getattr(getattr(mode, "counter", None), "mod_tracker", None)
    if tracker is None:
        tracker = getattr(mode, "_mod_tracker", None)
    return tracker if type(tracker) in _module_tracker_types() else None


def _activations(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """A region's values but parameters: what a module is called with and returns."""
    return tuple(v for v in values if not isinstance(v, torch.nn.Parameter))


def _requiring_grad(values: tuple[Any, ...]) -> list[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor) and v.requires_grad]


def _enter(tracker: Any, module: Any, backward: bool, hooks: bool, inputs: Any) -> None:
    """
    tracker enters module as its forward pre-hook and the gradient hooks it
    registers make it in eager (for a module inside torch.compile(module)
    too, which ModTracker's hooks skip: its ops are the graph's). With hooks
    (a graph run op by op under autograd), the backward leaves the module
    once its inputs have a gradient, as in eager, but on the first one (a
    region's inputs are more than the module's arguments: waiting for all
    would hold their gradients).
    """
    transitions = _transitions(tracker, module)
    transitions.append(backward)()
    if backward:
        return
    if getattr(tracker, "_user_pre_fw_hook", None) is not None:
        tracker._user_pre_fw_hook(module, inputs)
    if hooks:
        if tensors := _requiring_grad(inputs):
            transitions.hook(register_multi_grad_hook(tensors, transitions.pop(True), mode="any"))
        elif hasattr(tracker, "_post_bw_callbacks_to_enqueue"):
            tracker._post_bw_callbacks_to_enqueue.append(transitions.pop(True))


def _leave(tracker: Any, module: Any, backward: bool, hooks: bool, outputs: Any) -> None:
    """tracker leaves module as its forward hook makes it in eager."""
    transitions = _transitions(tracker, module)
    if not backward and getattr(tracker, "_user_post_fw_hook", None) is not None:
        tracker._user_post_fw_hook(module, (), outputs)
    transitions.pop(backward)()
    if hooks and not backward and (tensors := _requiring_grad(outputs)):
        transitions.hook(register_multi_grad_hook(tensors, transitions.append(True), mode="any"))


class _transitions:
    """A module tracker's own functions that enter and leave module."""

    def __init__(self, tracker: Any, module: Any) -> None:
        self.tracker = tracker
        name = tracker._get_mod_name(module)
        # ModTracker's take the module (weakly), ModuleTracker's do not.
        self.key = (name,) if not hasattr(tracker, "_user_pre_fw_hook") else (weakref.ref(module), name)

    def append(self, backward: bool) -> Callable[..., None]:
        return self.tracker._get_append_fn(*self.key, backward)

    def pop(self, backward: bool) -> Callable[..., None]:
        return self.tracker._get_pop_fn(*self.key, backward)

    def hook(self, handle: Any) -> None:
        # ModuleTracker removes its gradient hooks on exit.
        if isinstance(getattr(self.tracker, "_hooks", None), list):
            self.tracker._hooks.append(handle)
