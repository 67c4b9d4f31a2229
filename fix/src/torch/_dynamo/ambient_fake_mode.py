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
# (compile_unlowered), and answers with BackendGraphs: AOTAutograd's runtime
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
# cache lookup keys by a backend of their own (callback_for_fake_calls), so
# such calls never look up real entries, nor real calls theirs, whatever
# guards a guard_filter_fn left (skip_all_guards_unsafe drops them all, and
# the entry must then have none): every compiled call pays one flag read,
# nothing per entry. FakeTensors called outside any mode share the
# usual callback, and TENSOR_MATCH checks a tensor input's type, so
# FAKE_TENSOR_MODE goes only where no tensor input tells them apart: on every
# entry compiled for fake calls, on real entries without tensor inputs, and on
# real entries of frames already called for fake that none of the frame's own
# tensor arguments reaches (a module with real parameters called with an
# int). Frames never called for fake pay nothing. Under a guard filter that
# drops TENSOR_MATCH, such calls reach whatever entry is there, as on stock;
# an entry compiled for them has the backend compile for real on its first
# real call (DeferredCompile), so real calls never run op by op.
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
# call made its outputs (_Replay), and a later call with the same metadata
# makes them again from that record without running the graph's ops, as
# FakeTensorMode's dispatch cache rebuilds an op's output, so what a call
# saves for backward is the same; a record is kept only once it rebuilt
# exactly what the graph made (see Note [Replaying a graph's outputs from
# their metadata]). Only where that is sound: graphs of ATen ops that mutate nothing,
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
import functools
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Optional, TYPE_CHECKING

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, is_fake

from . import config, fake_mode_compat as _compat
from .utils import counters


if TYPE_CHECKING:
    from .output_graph import OutputGraph


log = logging.getLogger(__name__)


__all__ = [
    "BackendGraphs",
    "DeferredCompile",
    "FakeCalls",
    "FakeModeRuntime",
    "active_fake_mode",
    "backend_graphs_for_fake_calls",
    "capture_ambient_fake_mode",
    "compile_unlowered",
    "compile_unlowered_kernels",
    "called_with_fakes",
    "fake_modes_of",
    "state",
    "tracer_owns_call",
    "users_fake_mode",
]


class _AmbientFakeModeState(threading.local):
    """
    Set by CatchErrorsWrapper while it compiles a frame: whether the frame may
    be compiled for fake calls at all, the user's FakeTensorMode the frame was
    called under (captured before the ambient modes are disabled for
    compilation), and whether a guard_filter_fn will filter the frame's guards.
    Entry points that do not go through it (export, aot_compile) leave them
    unset.
    """

    enabled: bool = False
    mode: Optional[FakeTensorMode] = None
    guards_filtered: bool = False


state = _AmbientFakeModeState()

# Code objects of frames compiled for fake calls: a real entry compiled later
# for such a frame guards on the fake mode (see fake_mode_guards.py).
codes_compiled_for_fake: "weakref.WeakSet[Any]" = weakref.WeakSet()


def active_fake_mode() -> Optional[FakeTensorMode]:
    """The FakeTensorMode active on this thread, a user's or a tracer's."""
    return _get_dispatch_mode(_FAKE)


# Looked up once: compile_wrapper asks on every compiled call under a
# dispatch mode.
_get_dispatch_mode = torch._C._get_dispatch_mode
_FAKE = torch._C._TorchDispatchModeKey.FAKE


def users_fake_mode() -> Optional[FakeTensorMode]:
    """
    The user's FakeTensorMode this call runs under, if any: the active one,
    unless a tracer owns the call (its mode is the tracer's) or
    config.inherit_ambient_fake_mode is off.
    """
    # The mode first: a call under another dispatch mode pays one lookup.
    mode = active_fake_mode()
    if mode is None or not config.inherit_ambient_fake_mode or tracer_owns_call():
        return None
    return mode


def fake_modes_of(args: Sequence[Any]) -> set[FakeTensorMode]:
    """The modes of the FakeTensors among args, and the active one."""
    modes = {arg.fake_mode for arg in args if isinstance(arg, FakeTensor)}
    mode = active_fake_mode()
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
    prev = (state.enabled, state.mode, state.guards_filtered)
    state.enabled = config.inherit_ambient_fake_mode and not tracer_owns_call()
    state.mode = active_fake_mode() if state.enabled else None
    state.guards_filtered = guard_filter_fn is not None
    try:
        yield
    finally:
        state.enabled, state.mode, state.guards_filtered = prev


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
        # real call of a fake entry (see DeferredCompile).
        self.real_calls: Optional[DeferredCompile] = None

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
    return active_fake_mode() is not None or any(
        isinstance(arg, FakeTensor) for arg in args
    )


class DeferredCompile:
    """
    The backend's real compile of a graph compiled for fake calls, made on
    its first real call, as Dynamo would have made it for the frame. A
    guard_filter_fn may drop the guards that keep real and fake calls apart
    (skip_all_guards_unsafe drops them all), and then an entry real calls
    look up (FakeTensors called outside any mode, a mode entered inside a
    compiled region) serves both: real calls after a fake dry run run the
    backend's artifact, at its speed.
    Holds a copy of the graph the backend is given (it may rewrite that one
    in place), the example inputs and the TracingContext until then. Guards
    the backend would add on that compile are not installed: the filter
    already dropped the entry's.
    """

    def __init__(
        self,
        output_graph: "OutputGraph",
        gm: fx.GraphModule,
        example_inputs: Sequence[Any],
    ) -> None:
        self.compiler_fn = output_graph.compiler_fn
        self.gm = _copy_for_backend(output_graph, gm)
        self.example_inputs = list(example_inputs)
        self.tracing_context = output_graph.tracing_context
        # The global state (grad mode, autocast) the frame was called under.
        self.frame_state = self.tracing_context.global_context.copy_graphstate()
        self.compiled_fn: Optional[Callable[..., Any]] = None

    def __call__(self, *args: Any) -> Any:
        compiled_fn = self.compiled_fn
        if compiled_fn is None:
            compiled_fn = self.compile()
        return compiled_fn(*args)

    def compile(self) -> Callable[..., Any]:
        from torch.utils._python_dispatch import _disable_current_modes

        from .convert_frame import compile_lock
        from .output_graph import OutputGraph

        with compile_lock, _disable_current_modes():
            if self.compiled_fn is not None:
                return self.compiled_fn
            context = self.tracing_context
            now: dict[str, Any] = {}
            # save_global_state only reads the global state when given out=.
            OutputGraph.save_global_state(None, out=now)  # type: ignore[arg-type]
            context.global_context.restore_graphstate(self.frame_state)
            try:
                with torch._guards.tracing(context):
                    compiled_fn = self.compiler_fn(self.gm, self.example_inputs)
            except Exception:
                if not config.suppress_errors:
                    raise
                # As Dynamo does for a backend that fails: run eagerly.
                log.warning(
                    "Backend compile failed on the first real call of a graph "
                    "compiled for fake calls; its real calls run eagerly",
                    exc_info=True,
                )
                compiled_fn = self.gm.forward
            finally:
                context.global_context.restore_graphstate(
                    type(self.frame_state)(now)
                )
            self.compiled_fn = compiled_fn
            del self.gm, self.example_inputs, self.tracing_context
        return compiled_fn


def _copy_for_backend(output_graph: "OutputGraph", gm: fx.GraphModule) -> fx.GraphModule:
    """
    A copy of the graph Dynamo gives the backend, with what Dynamo sets on it
    before the call (OutputGraph._call_user_compiler); node metadata is shared.
    """
    from torch.fx._lazy_graph_module import _make_graph_module

    copied = _make_graph_module(gm, copy.deepcopy(gm.graph))
    copied.meta = dict(gm.meta)
    copied._param_name_to_source = output_graph.param_name_to_source  # type: ignore[assignment]
    copied._source_to_user_stacks = getattr(output_graph, "source_to_user_stacks", None)  # type: ignore[assignment]
    copied.compile_subgraph_reason = getattr(gm, "compile_subgraph_reason", None)  # type: ignore[assignment]
    for node in copied.graph.find_nodes(op="placeholder"):
        if "grapharg" in node.meta:
            node._dynamo_source = node.meta["grapharg"].source  # type: ignore[attr-defined]
    return copied


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

    replay = _Replay() if _is_functional(gm) else None
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


class _Replay:
    """
    How an unlowered graph made its outputs, per inputs' metadata, for calls
    the graph's ops need not see: a repeated fake call makes its outputs
    again from the record instead of running the graph op by op, as
    FakeTensorMode's dispatch cache does for one op (and for Inductor's
    compiled regions under wrap_inductor_compiled_regions). Only for graphs
    of ATen ops that mutate nothing, calls under one FakeTensorMode with
    static shapes, outside inference mode, with no other dispatch mode or
    functorch transform (which must see the ops).

    See Note [Replaying a graph's outputs from their metadata].
    """

    MAX_ENTRIES = 8

    def __init__(self) -> None:
        # key -> how to make the outputs, or None where the graph runs.
        self.entries: dict[Any, Optional[tuple[Any, ...]]] = {}

    def key(self, args: Sequence[Any]) -> Optional[tuple[tuple[Any, ...], FakeTensorMode]]:
        """The call's key and mode, or None if it must run the graph."""
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        mode = active_fake_mode()
        if (
            len(_get_current_dispatch_mode_stack()) > (mode is not None)
            or torch._C._functorch.peek_interpreter_stack() is not None
            or torch.is_inference_mode_enabled()
            # Forward-mode AD: the graph's ops compute the outputs' tangents.
            or torch.autograd.forward_ad._current_level >= 0
        ):
            return None
        key: list[Any] = [
            torch.is_grad_enabled(),
            torch.is_autocast_enabled("cpu"),
            torch.get_autocast_dtype("cpu"),
            torch.is_autocast_enabled("cuda"),
            torch.get_autocast_dtype("cuda"),
            torch.get_default_dtype(),
        ]
        # Which inputs are one tensor, or share a storage: outputs that are
        # inputs or their views are made from the same ones.
        storages: dict[int, int] = {}
        for index, arg in enumerate(args):
            if isinstance(arg, torch.Tensor):
                # Real tensors (a FakeTensorMode(allow_non_fake_inputs=True)
                # fakes them as the graph's ops run) count by metadata too.
                if type(arg) is FakeTensor:
                    if mode is None:
                        mode = arg.fake_mode
                    elif arg.fake_mode is not mode:
                        return None
                    if arg.constant is not None:
                        return None
                elif type(arg) not in (torch.Tensor, torch.nn.Parameter):
                    return None
                if arg._has_symbolic_sizes_strides or arg.layout != torch.strided:
                    return None
                key.append(
                    (
                        arg.shape,
                        arg.stride(),
                        arg.storage_offset(),
                        arg.dtype,
                        arg.device,
                        arg.requires_grad,
                        arg.is_conj(),
                        arg.is_neg(),
                        # A view of an input is made on its storage.
                        arg.untyped_storage().nbytes(),
                        storages.setdefault(arg.untyped_storage()._cdata, index),
                    )
                )
            elif isinstance(arg, (int, float, bool, type(None))):
                key.append((type(arg), arg))
            else:
                return None
        if mode is None or getattr(mode, "propagate_real_tensors", False):
            return None
        # Real inputs raise under a mode that does not allow them.
        key.append(mode.allow_non_fake_inputs)
        return tuple(key), mode

    def outputs(
        self, key: tuple[Any, ...], mode: FakeTensorMode, args: Sequence[Any]
    ) -> Optional[Any]:
        recorded = self.entries.get(key)
        if recorded is None:
            return None
        try:
            outputs = _rebuild(recorded, mode, args)
        except Exception:
            # What the record proved for one call does not hold for this one:
            # the graph runs, now and for later calls with this key.
            log.debug("Not replayed: rebuilding the outputs failed", exc_info=True)
            self.entries[key] = None
            return None
        counters["fake_mode"]["graphs_replayed"] += 1
        return outputs

    def record(
        self,
        key: tuple[Any, ...],
        mode: FakeTensorMode,
        args: Sequence[Any],
        outputs: Any,
    ) -> None:
        """Keep how the call made its outputs, if rebuilding them from that
        gives back exactly what the graph made."""
        if key in self.entries or len(self.entries) >= self.MAX_ENTRIES:
            return
        self.entries[key] = None
        facts = replay_facts(mode, args, outputs)
        recorded = _recipes(facts)
        if recorded is None:
            return
        try:
            rebuilt = _rebuild(recorded, mode, args)
        except Exception:
            log.debug("Not replayed: rebuilding the outputs failed", exc_info=True)
            return
        if replay_facts(mode, args, rebuilt) != facts:
            log.debug("Not replayed: the rebuilt outputs differ from the graph's")
            return
        self.entries[key] = recorded


# Note [Replaying a graph's outputs from their metadata]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A replayed output must be what running the graph would have made, or the
# fake call answers wrong without a word. So the record holds no metadata of
# its own choosing: it is made from replay_facts, what a replay must
# reproduce. Each output is an input or an earlier output (the same object),
# a value, or a tensor described by FakeTensorMode's own TensorMetadata (what
# its dispatch cache keys and rebuilds a cached output from: dtype, shape,
# stride, storage offset and bytes, device, layout, memory format,
# requires_grad, conj / neg bits, inference) together with the input or
# output it shares a storage with, has as _base, and shares a version counter
# with. A tensor of its own is rebuilt as the dispatch cache rebuilds one: a
# meta tensor of that metadata wrapped for the mode, set onto the storage it
# shares (wrapping a meta view of what it shares a version counter with, if
# it does). A view is made by an op, so autograd makes it a view, as the
# graph's op did (of its base, or of a base of a storage of its size where
# the graph does not return the base), through view_as_real / view_as_complex
# where its dtype is not its base's: one dispatch per view. A record is kept
# only after it proved itself: right after the graph ran, the outputs are
# rebuilt from it for the same inputs and their replay_facts compared; any
# difference, or anything the rebuild cannot make (data-dependent sizes), and
# the graph keeps running. Later calls with the same key (the inputs'
# metadata, storage sizes and aliasing, and the global state the ops read)
# rebuild from their own inputs; a rebuild that still fails drops the record.
# test_compile_under_fake_mode_replay.py checks it on generated graphs
# against running them.


def _recipes(facts: list[Any]) -> Optional[tuple[Any, ...]]:
    """How to make each output again, from its replay_facts, or None where
    the record cannot."""
    container, *outputs = facts
    if container not in (list, tuple):
        return None
    recipes: list[tuple[Any, ...]] = []
    for index, (kind, *fact) in enumerate(outputs):
        if kind == "is":
            recipes.append(fact[0])
        elif kind == "value":
            if fact[0] not in (int, float, bool, type(None)):
                return None
            recipes.append(("value", fact[1]))
        else:
            cls, owned, constant, metadata, *_, owner, base, counter = fact
            if (
                cls is not FakeTensor
                or not owned
                or constant
                or metadata.layout != torch.strided
                or _is_symbolic(metadata)
            ):
                return None
            if owner == ("output", index):
                owner = None
            # A non-view on the storage of what it shares a version counter
            # with (a detach of a view) is made from it.
            shares_counter = owner is not None and counter == owner
            recipes.append(("tensor", metadata, owner, base is not None, shares_counter))
    return container, tuple(recipes)


def _is_symbolic(metadata: Any) -> bool:
    """Whether metadata holds symbols (a data-dependent size): a replay would
    give a later call the first call's unbacked symbols."""
    return any(
        isinstance(value, torch.SymInt)
        for value in (
            *metadata.shape,
            *metadata.stride,
            metadata.storage_offset,
            metadata.storage_bytes,
        )
    )


def _positions(
    mode: FakeTensorMode, args: Sequence[Any]
) -> tuple[dict[int, tuple[str, int]], dict[Any, tuple[str, int]]]:
    """Which input each tensor input is, and whose storage each is."""
    from torch.multiprocessing.reductions import StorageWeakRef

    same: dict[int, tuple[str, int]] = {}
    owners: dict[Any, tuple[str, int]] = {}
    for index, arg in enumerate(args):
        if isinstance(arg, torch.Tensor):
            same.setdefault(id(arg), ("input", index))
            # The graph's ops see a real input as the mode's FakeTensor of it.
            owners.setdefault(
                StorageWeakRef(_as_fake(mode, arg).untyped_storage()), ("input", index)
            )
    return same, owners


def _as_fake(mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor:
    return t if isinstance(t, FakeTensor) else mode.from_tensor(t)


def _rebuild(recorded: tuple[Any, ...], mode: FakeTensorMode, args: Sequence[Any]) -> Any:
    container, recipes = recorded
    outputs: list[Any] = []
    # Views are made by ops (autograd makes them views), under the mode.
    with mode:
        for kind, *rest in recipes:
            if kind == "value":
                outputs.append(rest[0])
            elif kind == "input":
                outputs.append(args[rest[0]])
            elif kind == "output":
                outputs.append(outputs[rest[0]])
            else:
                metadata, owner, is_view, shares_counter = rest
                source = None
                if owner is not None:
                    where, index = owner
                    source = args[index] if where == "input" else outputs[index]
                    source = _as_fake(mode, source)
                outputs.append(
                    _make_tensor(mode, metadata, source, is_view, shares_counter)
                )
    return container(outputs)


def _make_tensor(
    mode: FakeTensorMode,
    m: Any,
    source: Optional[torch.Tensor],
    is_view: bool,
    shares_counter: bool,
) -> torch.Tensor:
    """A FakeTensor of metadata m on source's storage (a fresh one if None):
    a view of source if is_view, else a tensor of its own, sharing source's
    version counter if shares_counter. See Note [Replaying a graph's outputs
    from their metadata]."""
    from torch._subclasses.fake_tensor import in_kernel_invocation_manager

    if is_view:
        if source is None:
            # A view of an intermediate the graph does not return.
            with in_kernel_invocation_manager(mode):
                base = torch.empty(
                    (m.storage_bytes // m.dtype.itemsize,), dtype=m.dtype, device="meta"
                )
            source = FakeTensor(mode, base, m.device)
        # Autograd makes the op's output a view of source, as the graph's did
        # (_rebuild runs this under the mode).
        if source.dtype != m.dtype:
            source = _storage_as(source, m.dtype)
        made = source.as_strided(m.shape, m.stride, m.storage_offset)
        if made.is_conj() != m.is_conj:
            made = made.conj()
        if made.is_neg() != m.is_neg:
            made = torch._neg_view(made)
        return made
    with in_kernel_invocation_manager(mode):
        if shares_counter:
            # A meta view of source, wrapped as FakeTensorMode wraps a kernel's
            # output: a tensor of its own sharing source's version counter.
            if source.dtype != m.dtype:
                source = _storage_as(source, m.dtype)
            made = source.as_strided(m.shape, m.stride, m.storage_offset)
        else:
            made = torch.empty_strided(
                m.shape, m.stride, dtype=m.dtype, layout=m.layout, device="meta"
            )
            storage = None if source is None else source.untyped_storage()
            if storage is None and made.untyped_storage().nbytes() != m.storage_bytes:
                storage = torch.UntypedStorage(m.storage_bytes, device="meta")
            if storage is not None:
                # A fresh tensor's version counter is 0, as the op's output's.
                with torch.autograd._unsafe_preserve_version_counter(made):
                    made.set_(storage, m.storage_offset, m.shape, m.stride)
        if m.is_conj != made.is_conj():
            torch._C._set_conj(made, m.is_conj)
        if m.is_neg != made.is_neg():
            torch._C._set_neg(made, m.is_neg)
        made.requires_grad_(m.requires_grad)
    return FakeTensor(mode, made, m.device)


def _storage_as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A 1-d view of t's whole storage in dtype, made with view_as_real and
    view_as_complex where one dtype is complex (they keep the base, as the
    graph's ops did), else view(dtype); replay_facts tells a difference."""
    whole = t.as_strided((t.untyped_storage().nbytes() // t.dtype.itemsize,), (1,), 0)
    if whole.is_complex():
        whole = torch.view_as_real(whole).flatten()
    if dtype.is_complex:
        if whole.dtype != dtype.to_real():
            whole = whole.view(dtype.to_real())
        return torch.view_as_complex(whole.view(-1, 2))
    return whole if whole.dtype == dtype else whole.view(dtype)


def replay_facts(mode: FakeTensorMode, args: Sequence[Any], outputs: Any) -> list[Any]:
    """
    What a replay of outputs must reproduce, and all a record is made from:
    per output, a value, which input or earlier output it is, or, for a
    tensor, its type, whether mode owns it, whether it holds a constant, its
    TensorMetadata, version counter, leafness, grad_fn kind, which input or
    output it shares a storage with, has as _base (bases no input or output
    holds numbered as met) and shares its version counter with.
    """
    from torch._subclasses.fake_tensor import extract_tensor_metadata
    from torch.multiprocessing.reductions import StorageWeakRef

    facts: list[Any] = [type(outputs)]
    if not isinstance(outputs, (list, tuple)):
        return facts
    same, owners = _positions(mode, args)
    counters_of = _version_counters(args, outputs)
    bases: dict[int, tuple[str, int]] = {}
    for index, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor):
            facts.append(("value", type(out), out))
            continue
        if id(out) in same:
            facts.append(("is", same[id(out)]))
            continue
        same[id(out)] = ("output", index)
        base = out._base
        if base is not None:
            base = same.get(id(base)) or bases.setdefault(id(base), ("hidden", len(bases)))
        facts.append(
            (
                "tensor",
                type(out),
                getattr(out, "fake_mode", None) is mode,
                getattr(out, "constant", None) is not None,
                extract_tensor_metadata(out),
                out._version,
                out.is_leaf,
                type(out.grad_fn),
                owners.setdefault(StorageWeakRef(out.untyped_storage()), ("output", index)),
                base,
                counters_of[index],
            )
        )
    return facts


def _version_counters(args: Sequence[Any], outputs: Sequence[Any]) -> list[Any]:
    """
    Per output, the first input or output (by position) that shares its
    version counter, or None (not a tensor, or an inference tensor, which has
    none). Told by setting each counter to a mark in turn, then restoring
    them all.
    """
    tensors = [
        (("input", i), t) for i, t in enumerate(args) if isinstance(t, torch.Tensor)
    ] + [(("output", i), t) for i, t in enumerate(outputs) if isinstance(t, torch.Tensor)]
    tensors = [(where, t) for where, t in tensors if not t.is_inference()]
    versions = tuple(t._version for _, t in tensors)
    mark = 1 << 30
    first: dict[int, tuple[str, int]] = {}
    owner_of: dict[tuple[str, int], tuple[str, int]] = {}
    try:
        for number, (where, t) in enumerate(tensors):
            version = t._version
            if version >= mark and version - mark in first:
                owner_of[where] = first[version - mark]
            else:
                first[number] = where
                owner_of[where] = where
                torch._C._autograd._unsafe_set_version_counter((t,), (mark + number,))
    finally:
        torch._C._autograd._unsafe_set_version_counter(
            tuple(t for _, t in tensors), versions
        )
    return [owner_of.get(("output", i)) for i in range(len(outputs))]


def _fake_mode_of(args: Sequence[Any]) -> Any:
    """
    The mode of the FakeTensors a graph runs on when no FakeTensorMode is
    active (fake inputs called outside their mode, a backward run after
    leaving it): the factory ops of a backend's decompositions must make
    FakeTensors too.
    """
    if active_fake_mode() is None:
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
    import torch._functorch.config
    import torch._inductor.config

    tracing_context = torch._guards.TracingContext.get()
    compiling_for_fake_mode = tracing_context.compiling_for_fake_mode
    tracing_context.compiling_for_fake_mode = False
    try:
        # An unlowered artifact must never serve a real compile, and the
        # user's parameters stay (Inductor's freezing would discard them).
        with torch._functorch.config.patch(
            enable_autograd_cache=False
        ), torch._inductor.config.patch(freezing_discard_parameters=False):
            compiled_fn = build()
    finally:
        tracing_context.compiling_for_fake_mode = compiling_for_fake_mode
    return BackendGraphs(compiled_fn)


def compile_for_fake_calls(
    output_graph: "OutputGraph",
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
) -> Callable[..., Any]:
    """
    The backend sees the graph; Dynamo runs what it built for fake calls.
    """
    runtime = make_runtime(gm)
    if output_graph.fake_calls.guards_filtered:
        runtime.real_calls = DeferredCompile(output_graph, gm, example_inputs)
    output_graph.fake_calls.compiled_for_fake = True
    codes_compiled_for_fake.add(output_graph.root_tx.f_code)
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
