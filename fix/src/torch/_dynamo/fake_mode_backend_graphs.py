"""
The graphs an AOTAutograd backend (aot_eager, aot_autograd(...), Inductor's
compile_fx) builds for a graph compiled for calls under a user's
FakeTensorMode: its pipeline as for the real run, with compilers that lower
nothing. The backends call backend_graphs_for_fake_calls from their own code
when TracingContext.compiling_for_fake_mode is set, with the options they own
for such a compile. See Note [Inheriting the ambient FakeTensorMode] in
ambient_fake_mode.py.
"""

import contextlib
import copy
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor

from . import config
from .ambient_fake_mode import BackendGraphs
from .fake_mode_replay import Replay


log = logging.getLogger(__name__)


def compile_unlowered(gm: fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
    """
    An AOTAutograd compiler, or Inductor inner_compile, that lowers nothing:
    the graph it is given is what runs.
    """
    return _boxed_run(gm, mutated=())


def _boxed_run(gm: fx.GraphModule, mutated: Sequence[int]) -> Callable[..., Any]:
    """
    Runs gm boxed, under its inputs' FakeTensorMode if none is active, keeping
    the version counters of the inputs at the indices in mutated.
    """

    replay = Replay() if _is_functional(gm) else None
    # Built on the first call that runs it.
    boxed = functools.cache(lambda: _boxed_graph_module(gm))

    def run(args: list[Any]) -> Any:
        keyed = replay.key(args) if replay is not None else None
        if keyed is not None and (outputs := replay.outputs(*keyed, args)) is not None:
            return outputs
        with contextlib.ExitStack() as stack:
            stack.enter_context(_fake_mode_of(args))
            for index in mutated:
                # Inference tensors have no version counter.
                if not args[index].is_inference():
                    stack.enter_context(
                        torch.autograd._unsafe_preserve_version_counter(args[index])
                    )
            if keyed is None and boxed() is not None:
                # It clears args and frees each input after its last use, as
                # the backend's compiled code does: the compiled backward
                # frees what the forward saved as it goes.
                outputs = boxed().forward(args)
            else:
                outputs = gm.forward(*args)
        if keyed is not None:
            replay.record(*keyed, args, outputs)
        return outputs

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _boxed_graph_module(gm: fx.GraphModule) -> Optional[fx.GraphModule]:
    """gm with the boxed calling convention (None where FX lacks it)."""
    codegen = getattr(fx.graph, "_BoxedCodeGen", None)
    if codegen is None:
        return None
    boxed = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    boxed.graph.set_codegen(codegen())
    boxed.recompile()
    return boxed


def _is_functional(gm: fx.GraphModule) -> bool:
    """Whether gm only calls ATen ops that mutate nothing (no HOP, no
    effect): all a call does is make its outputs."""
    import operator

    for node in gm.graph.nodes:
        if node.op in ("call_module", "call_method"):
            return False
        if node.op == "call_function" and node.target is not operator.getitem:
            if not isinstance(node.target, torch._ops.OpOverload):
                return False
            if node.target._schema.is_mutable:
                return False
    return True


def _fake_mode_of(args: Sequence[Any]) -> Any:
    """
    The mode of the FakeTensors a graph runs on when no FakeTensorMode is
    active (fake inputs called outside their mode, a backward run after
    leaving it): the factory ops of a backend's decompositions must make
    FakeTensors too.
    """
    if torch._guards.active_fake_mode() is None:
        for arg in args:
            if isinstance(arg, FakeTensor):
                return arg.fake_mode
    return contextlib.nullcontext()


def compile_unlowered_kernels(
    gm: fx.GraphModule, example_inputs: Any, **kwargs: Any
) -> Any:
    """
    Inductor's inner_compile for fake calls: runs the graph, but writes the
    inputs it mutates as Inductor's kernels do, without bumping their version
    counters (AOTAutograd's runtime bumps them once, as eager's in-place op).
    """
    mutated = [
        index
        for index, placeholder in enumerate(gm.graph.find_nodes(op="placeholder"))
        if any(
            node.target is torch.ops.aten.copy_.default and node.args[0] is placeholder
            for node in placeholder.users
        )
    ]
    return _boxed_run(gm, mutated)


def _missing_device(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Optional[str]:
    """
    A device type of the graph's tensors that this machine lacks. A backend's
    pipeline needs it: the autograd engine traces a backward on FakeTensors of
    a device type only where one exists (as eager's backward runs), and
    Inductor's joint-graph passes fold constants on the device.
    """
    values = [
        node.meta.get("example_value") for node in gm.graph.nodes
    ] + list(example_inputs)
    for device_type in {v.device.type for v in values if isinstance(v, torch.Tensor)}:
        if device_type in ("cpu", "meta"):
            continue
        try:
            available = torch.get_device_module(device_type).is_available()
        except (AttributeError, RuntimeError):
            available = False
        if not available:
            return device_type
    return None


def _has_data_dependent_sizes(gm: fx.GraphModule) -> bool:
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    from torch.utils import _pytree as pytree

    # Values hold other things too (a leaf function's TreeSpec).
    return any(
        free_unbacked_symbols(value)
        for node in gm.graph.nodes
        for value in pytree.tree_leaves(node.meta.get("example_value"))
        if isinstance(value, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool))
    )


def backend_graphs_for_fake_calls(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    build: Callable[[], Callable[..., Any]],
) -> Callable[..., Any]:
    """
    Called by a backend built on AOTAutograd when compiling_for_fake_mode is
    set: build() runs its graph pipeline as for a real compile, with
    compile_unlowered as its compilers.
    """
    if not config.fake_mode_runs_backend_graphs:
        return gm
    if (device_type := _missing_device(gm, example_inputs)) is not None:
        why = f"the backend's graph pipeline needs a {device_type} device, which this machine lacks"
    elif _has_data_dependent_sizes(gm):
        why = "AOTAutograd's runtime cannot run graphs with data-dependent sizes on FakeTensors"
    else:
        why = None
    if why is not None:
        log.warning(
            "A graph compiled for calls under a FakeTensorMode runs op by op "
            "(eager's saved tensors, not the compiled run's): %s",
            why,
        )
        return gm
    tracing_context = torch._guards.TracingContext.get()
    compiling_for_fake_mode = tracing_context.compiling_for_fake_mode
    tracing_context.compiling_for_fake_mode = False
    try:
        compiled_fn = build()
    finally:
        tracing_context.compiling_for_fake_mode = compiling_for_fake_mode
    return BackendGraphs(compiled_fn)


def aot_autograd_graphs_for_fake_calls(
    gm: fx.GraphModule, example_inputs: Sequence[Any], kwargs: dict[str, Any]
) -> Callable[..., Any]:
    """What an aot_autograd(**kwargs) backend answers for a graph compiled for
    fake calls: the graphs it builds for the real run, with compilers that
    lower nothing."""
    from .backends.common import aot_autograd

    unlowered = aot_autograd(
        **{
            **kwargs,
            "fw_compiler": compile_unlowered,
            "bw_compiler": compile_unlowered,
            "inference_compiler": compile_unlowered,
        }
    )
    return backend_graphs_for_fake_calls(
        gm, example_inputs, lambda: unlowered(gm, example_inputs)
    )


def compiling_for_fake_calls() -> bool:
    """Whether the backend compiles a graph Dynamo compiled for fake calls
    (TracingContext.compiling_for_fake_mode): it must not lower it."""
    tracing_context = torch._guards.TracingContext.try_get()
    return tracing_context is not None and tracing_context.compiling_for_fake_mode


def aot_autograd_caches_off() -> Any:
    """What an AOTAutograd backend compiles a graph for fake calls under: no
    AOTAutograd cache, local or remote, serves or keeps its unlowered graphs
    (a cached real artifact would run on FakeTensors)."""
    return torch._functorch.config.patch(
        enable_autograd_cache=False, enable_remote_autograd_cache=False
    )
