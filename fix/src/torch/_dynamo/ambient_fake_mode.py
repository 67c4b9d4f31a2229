"""
Compiled functions called under a user's FakeTensorMode: which mode a call
brings, whether a graph is compiled for fake calls, and what such a graph runs.

See Note [Inheriting the ambient FakeTensorMode] below.
"""

# Note [Inheriting the ambient FakeTensorMode]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Users call compiled functions under a FakeTensorMode they created (to
# estimate memory or FLOPs, or to check a model without its hardware), or on
# FakeTensors made by one. Such a call must behave like running the function
# eagerly under that mode, whatever the backend: its outputs are FakeTensors
# owned by the user's mode, with the metadata eager gives.
#
# Whose mode. CatchErrorsWrapper captures the FakeTensorMode active when a
# frame is called (capture_ambient_fake_mode), before it disables the ambient
# modes for compiling, unless a tracer owns the call: export, make_fx,
# AOTAutograd, functionalization, pre-dispatch tracing and Dynamo itself enter
# FakeTensorModes of their own and trace through compiled functions (such as
# the branches torch.cond compiles), so they must see the graph's ops. Nothing
# here applies to those calls, to export, or to entry points that do not go
# through CatchErrorsWrapper (aot_compile). A graph is compiled for fake when
# a user's mode was captured or a graph input is a user's FakeTensor.
#
# Compiling. Dynamo traces with its own FakeTensorMode as always; the user's
# FakeTensors are refakified, so tracing never mutates them. The backend is
# called with the graph as usual, so counters, graph recorders and custom
# backends see what was captured, with TracingContext.compiling_for_fake_mode
# set: no lowering, no code generation, no device (Inductor's kernels would
# read the FakeTensors' data pointers, and a fake cuda tensor need not have a
# device). config.compile_backend_under_fake_mode makes the backend compile
# for real anyway, to check that a model compiles; its artifact never runs.
#
# Running (FakeModeRuntime). A fake call is made to learn what the compiled
# run will do, its memory above all, and compiling changes memory:
# AOTAutograd's partitioner decides what the forward saves for backward and
# what the backward recomputes (min-cut, activation_memory_budget, selective
# checkpointing), after the backend's decompositions and joint-graph passes.
# So a backend built on AOTAutograd (AotAutograd: aot_eager and any
# aot_autograd(...) backend; compile_fx: inductor) runs its own graph pipeline
# as for a real compile, with compilers that lower nothing
# (fake_mode_backend_graphs.py), and answers with BackendGraphs: AOTAutograd's runtime
# over the forward and backward graphs it built, which Dynamo runs under the
# caller's FakeTensorMode. What the forward saves, what the backward
# recomputes and the outputs' metadata are the compiled run's; a dispatch mode
# sees the graphs' ops (Inductor's kernels would hide all but its extern
# kernels). A backend's own compilers are not called: their artifacts would
# not run on FakeTensors. Nothing the pipeline builds is cached. Graphs whose
# tensors live on a device type this machine lacks (the autograd engine and
# Inductor's constant folding need it: estimate a cuda model where a GPU is)
# or that have data-dependent sizes run op by op, with a warning.
# Every other backend (eager, custom ones) and config.fake_mode_runs_backend_graphs
# = False run Dynamo's own copy of the captured graph (the backend may rewrite
# the one it is given) op by op, exactly as the eager backend would: nothing
# is traced twice, the fastest answer, with eager's autograd (saved tensors,
# double backward), views, mutations and version counters. Either way the
# outputs are owned by the caller's mode, and dispatch modes on top
# (FlopCounterMode, DebugMode, FSDPMemTracker, selective checkpointing's
# caching modes) see the ops that run.
#
# Guards (fake_mode_guards.py). Real and fake calls must not share an entry.
# A call under a FakeTensorMode installs a callback whose entries Dynamo's
# cache lookup keys by a backend of their own (for_call_under_modes), so
# such calls never look up real entries, nor real calls theirs, whatever
# guards a guard_filter_fn left (skip_all_guards_unsafe drops them all, and
# the entry must then have none); a run-only fake call (torch._dynamo.run,
# the eager_on_recompile stance) looks up the entries compiled for fake calls
# of every backend. Every compiled call pays one flag read, nothing per
# entry, and entries compiled for real calls get no new guard. Entries
# compiled for fake calls get FAKE_TENSOR_MODE, for the lookups that match
# every backend's entries (a run-only real call). What the callback cannot
# see: a FakeTensorMode entered inside a compiled region, or a thread whose
# _is_in_torch_dispatch_mode flag (the process-wide flag stock Dynamo reads
# for modes) another thread's mode exit cleared: such a call looks up real
# entries, whose guards tell a fake call apart only by its tensor inputs.
# FakeTensors called outside any mode share the usual callback: TENSOR_MATCH
# checks a tensor input's type. Under a guard filter that drops it, such calls
# reach whatever entry is there, as on stock; an entry compiled for them has
# the backend compile for real on its first real call (DeferredCompile), so
# real calls never run op by op.
# Entries compiled under a user's FakeTensorMode count toward recompile limits
# of their own (cache_size.py), so a dry run never makes a later real call
# run eagerly; past their limit, fake calls run their entries only, without
# marking the code run-only for real ones. Automatic dynamic shapes learn from
# fake calls into a code state of their own, joined with real calls'
# (code_state_of_call): a dry run at another shape leaves the next real
# compile static.
#
# Dispatch modes (fake_mode_trackers.py). Dynamo skips frames called under a
# non-infra dispatch mode (a tracker such as FlopCounterMode or MemTracker):
# it traces without the mode and cannot trace the module hooks trackers
# install. Such a frame runs eagerly under the modes, as on stock, so the
# tracker sees its ops and every module; an entry compiled for fake calls
# does not run under such a mode either (its guard sends the call back to
# eager). Under a user's FakeTensorMode, fullgraph=True does not fail with
# "found no compiled frames" for such a frame: the eager run under the modes
# is what the call is for.
#
# Steady state. People call a model under fake many times (a search over
# batch sizes, budgets or policies), so a repeated call must cost what a
# FakeTensorMode dispatch-cache hit costs, not a dispatch per op. Each graph
# a backend built for fake calls remembers, per inputs' metadata, how the
# call made its outputs (fake_mode_replay.Replay), and a later call with the same metadata
# makes them again from that record without running the graph's ops, as
# FakeTensorMode's dispatch cache rebuilds an op's output, so what a call
# saves for backward is the same; a record is kept only once it rebuilt
# exactly what the graph made (see Note [Replaying a graph's outputs from
# their metadata] in fake_mode_replay.py). Only where that is sound: graphs of ATen ops that mutate nothing,
# static shapes, one FakeTensorMode, and no other dispatch mode or functorch
# transform, which must see the ops (a tracker, a recording mode); anything
# else runs the graph. Graphs run op by op (the eager backend, custom
# backends) keep eager's autograd and are not replayed, except as regions.
#
# Regions (opt-in, fake_mode_regions.py). With config.fake_mode_region_after_calls = N,
# an entry that made N calls autograd does not record is replayed as one
# fake_mode_region op that FakeTensorMode's dispatch cache serves.
#
# config.inherit_ambient_fake_mode = False restores the old behaviour: the
# backend's artifact runs on whatever it is given.

import contextlib
import copy
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Optional, TYPE_CHECKING

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, is_fake

from . import config, fake_mode_compat as _compat


if TYPE_CHECKING:
    from .output_graph import OutputGraph


log = logging.getLogger(__name__)


__all__ = [
    "BackendGraphs",
    "FakeCalls",
    "FakeModeRuntime",
    "capture_ambient_fake_mode",
    "called_with_fakes",
    "compile_for_fake_calls",
    "fake_modes_of",
    "state",
    "tracer_owns_call",
    "users_fake_mode",
]


class _AmbientFakeModeState(threading.local):
    """
    Set by CatchErrorsWrapper while it compiles a frame (captured): whether
    the frame may be compiled for fake calls at all, the user's
    FakeTensorMode the frame was called under (captured before the ambient
    modes are disabled for compilation), and whether a guard_filter_fn will
    filter the frame's guards.
    Entry points that do not go through it (export, aot_compile) leave them
    unset.
    """

    captured: bool = False
    enabled: bool = False
    mode: Optional[FakeTensorMode] = None
    guards_filtered: bool = False


state = _AmbientFakeModeState()


# The FakeTensorMode active on this thread, a user's or a tracer's, is
# _get_dispatch_mode(_FAKE): what torch._guards.active_fake_mode() finds by
# walking the mode stack, in O(1) (a FakeTensorMode is the stack's FAKE infra
# mode). compile_wrapper asks on every compiled call under a dispatch mode.
_get_dispatch_mode = torch._C._get_dispatch_mode
_FAKE = torch._C._TorchDispatchModeKey.FAKE


def users_fake_mode() -> Optional[FakeTensorMode]:
    """
    The user's FakeTensorMode this call runs under, if any: the active one,
    unless a tracer owns the call (its mode is the tracer's) or
    config.inherit_ambient_fake_mode is off.
    """
    # The mode first: a call under another dispatch mode pays one lookup.
    mode = _get_dispatch_mode(_FAKE)
    if mode is None or not config.inherit_ambient_fake_mode or tracer_owns_call():
        return None
    return mode


def fake_modes_of(args: Sequence[Any]) -> set[FakeTensorMode]:
    """The modes of the FakeTensors among args, and the active one."""
    modes = {arg.fake_mode for arg in args if isinstance(arg, FakeTensor)}
    mode = _get_dispatch_mode(_FAKE)
    if mode is not None:
        modes.add(mode)
    return modes


def tracer_owns_call() -> bool:
    """
    Whether a tracer (export, make_fx, AOTAutograd, functionalization,
    pre-dispatch tracing, Dynamo itself) is tracing through this call. The
    FakeTensorMode active then is the tracer's, not a user's: the tracer must
    record the graph's own ops.
    """
    get_mode = torch._C._get_dispatch_mode
    mode_key = torch._C._TorchDispatchModeKey
    return (
        torch._guards.TracingContext.try_get() is not None
        or torch.compiler.is_exporting()
        or _compat.is_non_strict_tracing()
        or torch._ops._len_torch_dispatch_stack_pre_dispatch() > 0
        or get_mode(mode_key.PROXY) is not None
        or get_mode(mode_key.FUNCTIONAL) is not None
    )


@contextlib.contextmanager
def capture_ambient_fake_mode(guard_filter_fn: Optional[Callable[..., Any]]) -> Iterator[None]:
    """
    Around the compilation of a frame, before the ambient modes are disabled:
    remember the user's FakeTensorMode the frame is called under.
    """
    prev = (state.captured, state.enabled, state.mode, state.guards_filtered)
    state.captured = True
    state.enabled = config.inherit_ambient_fake_mode and not tracer_owns_call()
    state.mode = _get_dispatch_mode(_FAKE) if state.enabled else None
    state.guards_filtered = guard_filter_fn is not None
    try:
        yield
    finally:
        state.captured, state.enabled, state.mode, state.guards_filtered = prev


class FakeCalls:
    """
    What an OutputGraph knows about fake calls of the frame it compiles.
    """

    def __init__(self, *, export: bool) -> None:
        # Whether this frame may be compiled for fake calls (no tracer owns
        # the call), and the user's FakeTensorMode it is called under, if any.
        self.enabled = state.enabled and not export
        self.mode: Optional[FakeTensorMode] = state.mode if self.enabled else None
        # A guard_filter_fn may drop the guards that keep real and fake calls
        # apart.
        self.guards_filtered = state.guards_filtered
        # Set once the graph is compiled for fake calls: its cache entry is a
        # fake one; and whether a FakeTensor input tells its calls apart.
        self.compiled_for_fake = False
        self.has_fake_tensor_input = False

    def mode_or_nullcontext(self) -> Any:
        """The user's mode, to create state under it as eager would."""
        return self.mode if self.mode is not None else contextlib.nullcontext()

    def is_compiling_for_fake(self, output_graph: "OutputGraph") -> bool:
        """
        True if this graph will be called on the FakeTensors of a user's
        FakeTensorMode: that mode was active when the frame was called, or a
        graph input is one of its FakeTensors.
        """
        if not self.enabled:
            return False
        return self.mode is not None or has_fake_tensor_input(output_graph)


def has_fake_tensor_input(output_graph: "OutputGraph") -> bool:
    return any(
        arg.is_tensor and is_fake(arg.example) for arg in output_graph.graphargs
    )


class FakeModeRuntime:
    """
    What a graph compiled for fake calls runs under the caller's FakeTensorMode:
    the backend's graphs if it built them, else the captured graph op by op, as
    the eager backend would.
    """

    def __init__(self, gm: fx.GraphModule) -> None:
        # A copy of its own: the backend may rewrite gm in place. Running it
        # needs no metadata, whose example values would keep Dynamo's
        # FakeTensorMode alive.
        graph = copy.deepcopy(gm.graph)
        for node in graph.nodes:
            node.meta = {}
        self.gm = fx.GraphModule(gm, graph)
        self.backend_graphs: Optional[BackendGraphs] = None
        # Under a guard_filter_fn, what the backend compiles on the first
        # real call of a fake entry (see fake_mode_guards.DeferredCompile).
        self.real_calls: Optional[Callable[..., Any]] = None

    def __call__(self, *args: Any) -> Any:
        return self.run(*args)

    def run(self, *args: Any) -> Any:
        if self.real_calls is not None and not called_with_fakes(args):
            return self.real_calls(*args)
        # Eager raises on FakeTensors of different modes, and so do the
        # captured graph's ops; AOTAutograd's runtime would abort.
        if self.backend_graphs is None or _mixes_fake_modes(args):
            return self.gm.forward(*args)
        return self.backend_graphs(*args)


def called_with_fakes(args: Sequence[Any]) -> bool:
    """A call under a FakeTensorMode, or on FakeTensors made by one."""
    return _get_dispatch_mode(_FAKE) is not None or any(
        isinstance(arg, FakeTensor) for arg in args
    )


def _mixes_fake_modes(args: Sequence[Any]) -> bool:
    return len(fake_modes_of(args)) > 1


def make_runtime(gm: fx.GraphModule) -> FakeModeRuntime:
    return FakeModeRuntime(gm)


class BackendGraphs:
    """
    A backend's answer for a graph compiled for fake calls: what its graph
    pipeline built for the real run, run under the caller's FakeTensorMode.
    """

    def __init__(self, compiled_fn: Callable[..., Any]) -> None:
        self.compiled_fn = compiled_fn

    def __call__(self, *args: Any) -> Any:
        return self.compiled_fn(*args)


def compile_for_fake_calls(
    output_graph: "OutputGraph",
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
) -> Callable[..., Any]:
    """
    The backend sees the graph; Dynamo runs what it built for fake calls.
    """
    if hasattr(output_graph, "bypass_package"):  # from 2.9 on
        output_graph.bypass_package("compiled for calls under a FakeTensorMode")
    runtime = make_runtime(gm)
    output_graph.fake_calls.compiled_for_fake = True
    output_graph.fake_calls.has_fake_tensor_input = has_fake_tensor_input(output_graph)
    tracing_context = output_graph.tracing_context
    tracing_context.compiling_for_fake_mode = (
        not config.compile_backend_under_fake_mode
    )
    try:
        with output_graph.restore_global_state():
            compiled_fn = output_graph.call_user_compiler(gm, example_inputs)
    finally:
        tracing_context.compiling_for_fake_mode = False
    if isinstance(compiled_fn, BackendGraphs):
        runtime.backend_graphs = compiled_fn
    return runtime
