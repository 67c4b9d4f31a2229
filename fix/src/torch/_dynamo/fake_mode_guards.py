"""
Real and fake calls of a compiled frame never share a cache entry.
See Note [Inheriting the ambient FakeTensorMode] in ambient_fake_mode.py.
"""

import copy
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Optional, TYPE_CHECKING

import torch
from torch import fx

from . import config, fake_mode_compat
from .ambient_fake_mode import _FAKE, _get_dispatch_mode, state, users_fake_mode
from .types import ConvertFrameReturn, FrameAction, FrameExecStrategy


if TYPE_CHECKING:
    from .output_graph import OutputGraph


log = logging.getLogger(__name__)


def fake_mode_active() -> bool:
    """
    What FAKE_TENSOR_MODE checks: whether a FakeTensorMode is active. While
    Dynamo compiles a frame, the ambient modes are disabled (and the frame's
    same-frame guard check runs that way, as every other guard needs): then it
    is the mode the frame was called under.
    """
    return _get_dispatch_mode(_FAKE) is not None or state.mode is not None


def guard_fake_entry(
    output_graph: "OutputGraph",
    runtime: Any,
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
) -> None:
    """
    An entry compiled for fake calls gets FAKE_TENSOR_MODE (see
    fake_tensor_mode_check). Real calls never look it up (callbacks of calls
    under a FakeTensorMode key their entries by a backend of their own, see
    for_call_under_modes) except in run-only lookups, which match entries
    of every backend: there the guard keeps them off it. Entries compiled for
    real calls get nothing new. Under a guard_filter_fn, which may drop the
    guards, the entry's real calls compile for real (DeferredCompile).
    """
    from .guards import GuardBuilder
    from .source import GlobalStateSource

    output_graph.guards.add(
        GlobalStateSource().make_guard(GuardBuilder.FAKE_TENSOR_MODE)
    )
    if output_graph.fake_calls.guards_filtered:
        runtime.real_calls = DeferredCompile(output_graph, gm, example_inputs)


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


def install_fake_tensor_mode_guard(builder: Any, guard: Any) -> str:
    """What GuardBuilder.FAKE_TENSOR_MODE installs: a lambda guard on the
    root. Returns its code, for guard dumps."""
    from .guards import get_verbose_code_parts

    code, check = fake_tensor_mode_check(builder.check_fn_manager.output_graph)
    user_stack = (guard.user_stack,) if fake_mode_compat.GUARDS_HAVE_USER_STACKS else ()
    builder.guard_manager.root.add_lambda_guard(
        lambda _: check(), get_verbose_code_parts([code], guard), *user_stack
    )
    return code


def fake_tensor_mode_check(output_graph: Any) -> tuple[str, Callable[[], bool]]:
    """
    What FAKE_TENSOR_MODE checks, as code for guard dumps and as a function.
    An entry compiled for fake calls runs only where a fake mode is active
    (unless a FakeTensor input already tells, through TENSOR_MATCH), and only
    where Dynamo would compile the frame: under a tracker mode
    (FlopCounterMode, MemTracker, ...) the frame runs eagerly instead, so the
    tracker sees its modules' hooks, whether or not the entry was compiled
    before the tracker was entered.
    """
    skips = fake_mode_compat.dynamo_skips_for_dispatch_mode
    if output_graph.fake_calls.has_fake_tensor_input:
        return "not ___dynamo_skips_for_dispatch_mode()", lambda: not skips()
    return "___fake_mode_active() and not ___dynamo_skips_for_dispatch_mode()", (
        lambda: fake_mode_active() and not skips()
    )


def mark_entry(guard_manager: Any, output_graph: Any) -> None:
    """
    Marks the entry CheckFunctionManager guards (compiled_for_fake_calls, read
    by cache_size.py): whether it counts toward the recompile limit of fake
    calls, as one compiled under a user's FakeTensorMode. output_graph may
    also be a deserialized guards state: a real entry's, as entries compiled
    for fake calls bypass precompile packages.
    """
    fake_calls = getattr(output_graph, "fake_calls", None)
    guard_manager.compiled_for_fake_calls = (
        fake_calls is not None and fake_calls.mode is not None
    )


def is_fake_entry(cache_entry: Any) -> bool:
    return getattr(cache_entry.guard_manager, "compiled_for_fake_calls", False)


def same_kind(cache_entry: Any, frame: Any) -> bool:
    """Whether cache_entry counts for the call of frame being compiled: its
    recompile limit and its recompilation reasons are those of the entries
    of its kind (compiled for fake calls, or not)."""
    return is_fake_entry(cache_entry) == is_fake_call(frame)


def is_fake_call(frame: Any) -> bool:
    """
    Whether the frame being compiled (or, outside a compile, called: the
    fail_on_recompile stance's callback) was called under a user's
    FakeTensorMode. A dry run under a FakeTensorMode must not change what
    later real calls do, so entries compiled under one and the others count
    toward their own recompile limits; calls on FakeTensors made outside any
    mode count with real ones, as on stock. (The same rule on both sides, and
    O(1).)
    """
    if not state.captured:
        return users_fake_mode() is not None
    return state.enabled and state.mode is not None


# What automatic dynamic shapes learned from fake calls: a code state per
# frame (CodeId), and per frame and input the entry of real calls last joined
# into it; for the code states of real calls (pgo.py's) they came from.
_fake_calls_code_states: tuple[Any, dict[Any, Any], dict[Any, Any]] = (None, {}, {})


def code_state_of_call(code_states: Any, code_id: Any, name: str) -> Any:
    """
    What automatic dynamic shapes (pgo.py's code_states) knows of a frame, for
    the compile of the current call, which learns about its input name. A
    call under a user's FakeTensorMode learns into a code state of its own,
    joined with what real calls learned of the input (a fake call predicts the
    next real call): a dry run at another shape must not make the next real
    compile dynamic. The fake calls' code states go with the code states they
    were joined with (torch._dynamo.reset() makes new ones).
    """
    global _fake_calls_code_states
    if not is_fake_call(None):
        return code_states[code_id]
    real, fakes, joined = _fake_calls_code_states
    if real is not code_states:
        fakes, joined = {}, {}
        _fake_calls_code_states = (code_states, fakes, joined)
    mine = fakes.get(code_id)
    if mine is None:
        mine = fakes[code_id] = code_states.default_factory()
    theirs = code_states.get(code_id)
    if theirs is not None and name in theirs.automatic_dynamic:
        entry = theirs.automatic_dynamic[name]
        if joined.get((code_id, name)) != entry:
            mine.automatic_dynamic[name] |= entry
            joined[code_id, name] = copy.copy(entry)
    return mine


def for_call_under_modes(
    callback: Any, fn: Callable[..., Any]
) -> tuple[Any, Callable[..., Any]]:
    """
    The callback compile_wrapper installs, and what it calls, for a call of
    fn made while a dispatch mode is active. Under a user's FakeTensorMode
    (not a tracer's: export, make_fx and AOTAutograd keep the given callback,
    as capture_ambient_fake_mode does) a callback that compiles as the given
    one but whose cache entries are keyed by a backend of their own
    (_FakeCallsBackend), so Dynamo's cache lookup never runs an entry
    compiled for real calls on a fake one, nor the reverse, whatever guards a
    guard_filter_fn left (skip_all_guards_unsafe leaves none). Run-only
    lookups (callback False: torch._dynamo.run, the eager_on_recompile
    stance) match entries of every backend: a fake call's match those
    compiled for fake calls, of every backend (FakeCallsRunOnly). Calls
    outside any dispatch mode pay one flag read in compile_wrapper; entries
    compiled for real calls get nothing new.
    """
    # compile_wrapper calls it only where a FakeTensorMode is active.
    if callback is None or users_fake_mode() is None:
        return callback, fn
    if callback is False:
        return FakeCallsRunOnly(), fn
    return FakeCallsCallback(callback), fn


class _FakeCallsBackend:
    """
    The backend cache entries compiled for fake calls are keyed by: equal to
    another one for an equal backend (as Dynamo compares backends), never
    equal to a backend itself. It holds its backend weakly, and lives as long
    as the backend does (_fake_calls_backends): one key per backend, as the
    real entries of a backend share theirs (some releases' cache entries
    hold their backend by a borrowed reference). A key without a backend
    (FakeCallsRunOnly's) is equal to every key.
    """

    def __init__(self, backend: Any, observed: bool) -> None:
        self.observed = observed
        if backend is None:
            # Run-only lookups: every backend's (FakeCallsRunOnly).
            self.backend = None
            return
        try:
            self.backend = weakref.ref(backend)
        except TypeError:
            # No weak reference to it (a builtin): kept for good.
            self.backend = lambda: backend

    def __eq__(self, other: object) -> bool:
        if type(other) is not _FakeCallsBackend or other.observed != self.observed:
            return False
        if self.backend is None or other.backend is None:
            return True
        mine, theirs = self.backend(), other.backend()
        return mine is not None and (mine is theirs or mine == theirs)

    __hash__ = None  # type: ignore[assignment]


# The keys of each backend called under a FakeTensorMode, by id and whether
# the calls are observed, until the backend goes; nothing is written on the
# user's backend.
_fake_calls_backends: dict[tuple[int, bool], _FakeCallsBackend] = {}


def _fake_calls_backend(backend: Any, observed: bool) -> _FakeCallsBackend:
    key = _fake_calls_backends.get((id(backend), observed))
    if key is None or key.backend() is not backend:
        key = _FakeCallsBackend(backend, observed)
        _fake_calls_backends[id(backend), observed] = key
        try:
            weakref.finalize(
                backend, _fake_calls_backends.pop, (id(backend), observed), None
            )
        except TypeError:
            pass
    return key


class FakeCallsCallback:
    """
    Compiles as the callback it wraps, for calls under a FakeTensorMode: the
    attribute Dynamo's cache lookup follows to a callback's backend ends at
    the backend's _FakeCallsBackend. Calls shown to trackers (observed, see
    fake_mode_trackers.py) have entries of their own.
    """

    def __init__(self, callback: Any, observed: bool = False) -> None:
        self.callback = callback
        self.observed = observed
        backend = callback
        while hasattr(backend, fake_mode_compat.WRAPPED_BACKEND_ATTR):
            backend = getattr(backend, fake_mode_compat.WRAPPED_BACKEND_ATTR)
        setattr(
            self,
            fake_mode_compat.WRAPPED_BACKEND_ATTR,
            _fake_calls_backend(backend, observed),
        )

    def __call__(self, frame: Any, cache_entry: Any, *args: Any, **kwargs: Any) -> Any:
        # A frame whose fake calls hit their recompile limit (in this
        # isolate_recompiles region) runs only its entries on fake calls, as
        # Dynamo makes a frame past its limit do, but the code object keeps no
        # such strategy: real calls still compile. (Its fake entries went,
        # torch._dynamo.reset(): it compiles.) Only cache misses get here.
        code, region = frame.f_code, _isolate_recompiles_id()
        past_limit = _past_fake_recompile_limit.get(code)
        if past_limit is not None and region in past_limit:
            if any(is_fake_entry(e) for e in _cache_entries(code, region, cache_entry)):
                return _run_only_this_call()
            past_limit.discard(region)
        result = self.callback(frame, cache_entry, *args, **kwargs)
        if (
            isinstance(result, ConvertFrameReturn)
            and result.apply_to_code
            and result.frame_exec_strategy.cur_action == FrameAction.RUN_ONLY
        ):
            _past_fake_recompile_limit.setdefault(code, set()).add(region)
            return _run_only_this_call()
        return result


class FakeCallsRunOnly:
    """
    The callback of a run-only call (torch._dynamo.run, the
    eager_on_recompile stance) under a FakeTensorMode: Dynamo's cache lookup
    matches the entries compiled for fake calls of every backend (never a
    real entry, whose code may not run on FakeTensors), and a miss runs the
    frame eagerly, compiling nothing, as a run-only call does.
    """

    def __init__(self) -> None:
        setattr(
            self,
            fake_mode_compat.WRAPPED_BACKEND_ATTR,
            _FakeCallsBackend(None, observed=False),
        )

    def __call__(self, frame: Any, cache_entry: Any, *args: Any, **kwargs: Any) -> Any:
        return ConvertFrameReturn(apply_to_code=False)


# Per code object, the isolate_recompiles regions where its fake calls hit
# their recompile limit (the only reason Dynamo runs a frame's existing
# entries only).
_past_fake_recompile_limit: "weakref.WeakKeyDictionary[Any, set[int]]" = (
    weakref.WeakKeyDictionary()
)


def _isolate_recompiles_id() -> int:
    """The isolate_recompiles region of this call (from 2.13; -1, the
    default region, before)."""
    get_id = getattr(
        torch._C._dynamo.eval_frame, "get_eval_frame_isolate_recompiles_id", None
    )
    return get_id() if get_id is not None else -1


def _cache_entries(code: Any, region: int, first: Any) -> list[Any]:
    """The cache entries of code in region, as convert_frame reads them (from
    2.13), or the linked list from the first entry (before)."""
    get_region = getattr(
        torch._C._dynamo.eval_frame, "_get_cache_entries_for_region", None
    )
    if get_region is not None:
        return get_region(code, region)
    entries = []
    while first is not None:
        entries.append(first)
        first = first.next
    return entries


def _run_only_this_call() -> ConvertFrameReturn:
    return ConvertFrameReturn(
        frame_exec_strategy=FrameExecStrategy(FrameAction.RUN_ONLY, FrameAction.RUN_ONLY),
        apply_to_code=False,
    )
