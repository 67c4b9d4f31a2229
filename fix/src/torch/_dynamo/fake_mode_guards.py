"""
Real and fake calls of a compiled frame never share a cache entry.
See Note [Inheriting the ambient FakeTensorMode] in ambient_fake_mode.py.
"""

import copy
import weakref
from collections.abc import Callable
from typing import Any, TYPE_CHECKING

import torch

from . import fake_mode_compat
from .ambient_fake_mode import (
    _FAKE,
    _get_dispatch_mode,
    active_fake_mode,
    codes_compiled_for_fake,
    state,
    users_fake_mode,
)
from .types import ConvertFrameReturn, FrameAction, FrameExecStrategy


if TYPE_CHECKING:
    from .output_graph import OutputGraph


def fake_mode_active() -> bool:
    """
    What FAKE_TENSOR_MODE checks: whether a FakeTensorMode is active. While
    Dynamo compiles a frame, the ambient modes are disabled (and the frame's
    same-frame guard check runs that way, as every other guard needs): then it
    is the mode the frame was called under.
    """
    return active_fake_mode() is not None or state.mode is not None


def _frame_tensor_inputs(output_graph: "OutputGraph") -> list[int]:
    """
    The graph inputs that are tensors the frame was called with (its own
    arguments, or items of a tuple, list or dict argument such as *args), not
    tensors it reached through attributes (a module's parameters) or globals.
    """
    from .source import DictGetItemSource, GetItemSource, LocalSource

    def is_frame_input(source: Any) -> bool:
        while isinstance(source, (GetItemSource, DictGetItemSource)):
            source = source.base
        return isinstance(source, LocalSource)

    return [
        i
        for i, arg in enumerate(output_graph.graphargs)
        if arg.is_tensor and is_frame_input(arg.source)
    ]


def needs_fake_tensor_mode_guard(output_graph: "OutputGraph") -> bool:
    """
    Every entry compiled for fake calls gets FAKE_TENSOR_MODE (see
    fake_tensor_mode_check). TENSOR_MATCH checks a tensor input's type, so a
    real entry is hit by a fake call only if no tensor input tells them
    apart: it guards when it has no tensor input at all, or, for a frame
    already called for fake, when none of its tensor inputs is one the frame
    was called with (a module with real parameters called with an int, then
    called again under a FakeTensorMode(allow_non_fake_inputs=True)). The
    guard is what keeps fake calls off such an entry where the cache identity
    of callback_for_fake_calls does not: run-only lookups, a FakeTensorMode
    entered inside a compiled call, and a call on a thread whose
    _is_in_torch_dispatch_mode flag another thread's mode exit cleared.
    """
    fake_calls = output_graph.fake_calls
    if not fake_calls.enabled:
        return False
    if fake_calls.is_compiling_for_fake(output_graph):
        return True
    if not any(arg.is_tensor for arg in output_graph.graphargs):
        return True
    return output_graph.root_tx.f_code in codes_compiled_for_fake and not (
        _frame_tensor_inputs(output_graph)
    )


def fake_tensor_mode_check(output_graph: Any) -> tuple[str, Callable[[], bool]]:
    """
    What FAKE_TENSOR_MODE checks, as code for guard dumps and as a function.
    A real entry runs only where no fake mode is active. An entry compiled
    for fake calls runs only where a fake mode is active (unless a FakeTensor
    input already tells, through TENSOR_MATCH), and only where Dynamo would
    compile the frame: under a tracker mode (FlopCounterMode, MemTracker, ...)
    the frame runs eagerly instead, so the tracker sees its modules' hooks,
    whether or not the entry was compiled before the tracker was entered.
    """
    in_fake_mode = output_graph.in_fake_tensor_mode
    skips = fake_mode_compat.dynamo_skips_for_dispatch_mode
    if not output_graph.fake_calls.compiled_for_fake:
        return f"___fake_mode_active() == {in_fake_mode}", (
            lambda: fake_mode_active() == in_fake_mode
        )
    if output_graph.fake_calls.has_fake_tensor_input:
        return "not ___dynamo_skips_for_dispatch_mode()", lambda: not skips()
    return "___fake_mode_active() and not ___dynamo_skips_for_dispatch_mode()", (
        lambda: fake_mode_active() and not skips()
    )


def compiled_for_fake_calls(output_graph: Any) -> bool:
    """Whether CheckFunctionManager guards an entry that counts toward the
    recompile limit of fake calls: one compiled under a user's FakeTensorMode
    (output_graph may also be a deserialized guards state)."""
    return bool(getattr(output_graph, "in_fake_tensor_mode", False))


def is_fake_entry(cache_entry: Any) -> bool:
    return getattr(cache_entry.guard_manager, "compiled_for_fake_calls", False)


def is_fake_call(frame: Any) -> bool:
    """
    Whether the frame being compiled was called under a user's FakeTensorMode.
    A dry run under a FakeTensorMode must not change what later real calls
    do, so entries compiled under one and the others count toward their own
    recompile limits; calls on FakeTensors made outside any mode count with
    real ones, as on stock. (The same rule on both sides, and O(1).)
    """
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


def callback_for_fake_calls(callback: Any) -> Any:
    """
    The callback Dynamo installs for a call made while a dispatch mode is
    active: under a FakeTensorMode, one that compiles as the given one does
    but whose cache entries are keyed by a backend of their own
    (_FakeCallsBackend), so Dynamo's cache lookup never runs an entry
    compiled for real calls on a fake one, nor the reverse, whatever guards a
    guard_filter_fn left (skip_all_guards_unsafe leaves none). Calls outside
    any dispatch mode pay one flag read in compile_wrapper, nothing per
    entry. A tracer's own FakeTensorMode (export, make_fx, AOTAutograd) keeps
    the given callback, as capture_ambient_fake_mode does. Run-only lookups
    (callback False: torch._dynamo.run, the eager_on_recompile stance) match
    entries of every backend, so there only guards keep the two apart.
    """
    # Inlined active_fake_mode(): calls under another dispatch mode pay one
    # lookup and no other call.
    if (
        _get_dispatch_mode(_FAKE) is None
        or callback is None
        or callback is False
        or users_fake_mode() is None
    ):
        return callback
    return FakeCallsCallback(callback)


class _FakeCallsBackend:
    """
    The backend cache entries compiled for fake calls are keyed by: equal to
    another one for an equal backend (as Dynamo compares backends), never
    equal to a backend itself. It holds its backend weakly, and lives as long
    as the backend does (_fake_calls_backends), as the entries compiled for
    the backend need: Dynamo's cache lookup reads it through borrowed
    references.
    """

    def __init__(self, backend: Any, observed: bool) -> None:
        self.observed = observed
        try:
            self.backend = weakref.ref(backend)
        except TypeError:
            # No weak reference to it (a builtin): kept for good.
            self.backend = lambda: backend

    def __eq__(self, other: object) -> bool:
        if type(other) is not _FakeCallsBackend or other.observed != self.observed:
            return False
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
        # A frame whose fake calls hit their recompile limit runs only its
        # entries on fake calls, as Dynamo makes a frame past its limit do,
        # but the code object keeps no such strategy: real calls still
        # compile. (Its fake entries went, torch._dynamo.reset(): it compiles.)
        code = frame.f_code
        if code in _codes_past_fake_recompile_limit:
            if cache_entry is not None and any(
                is_fake_entry(entry)
                for entry in torch._C._dynamo.eval_frame._debug_get_cache_entry_list(code)
            ):
                return _run_only_this_call()
            _codes_past_fake_recompile_limit.discard(code)
        result = self.callback(frame, cache_entry, *args, **kwargs)
        if (
            isinstance(result, ConvertFrameReturn)
            and result.apply_to_code
            and result.frame_exec_strategy.cur_action == FrameAction.RUN_ONLY
        ):
            _codes_past_fake_recompile_limit.add(code)
            return _run_only_this_call()
        return result


# Code objects whose fake calls hit their recompile limit (the only reason
# Dynamo runs a frame's existing entries only).
_codes_past_fake_recompile_limit: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _run_only_this_call() -> ConvertFrameReturn:
    return ConvertFrameReturn(
        frame_exec_strategy=FrameExecStrategy(FrameAction.RUN_ONLY, FrameAction.RUN_ONLY),
        apply_to_code=False,
    )
