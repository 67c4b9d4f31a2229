"""
Real and fake calls of a compiled frame never share a cache entry.
See Note [Inheriting the ambient FakeTensorMode] in ambient_fake_mode.py.
"""

import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any, TYPE_CHECKING

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor

from . import fake_mode_compat
from .ambient_fake_mode import codes_compiled_for_fake, make_runtime, state


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
    return (
        torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
        or state.mode is not None
    )


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
    called again under a FakeTensorMode(allow_non_fake_inputs=True)). Frames
    never called for fake pay nothing.
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


def needs_fake_calls_told_apart(output_graph: "OutputGraph") -> bool:
    """
    A guard_filter_fn may drop the guards that keep a real entry from fake
    calls: such an entry tells them apart when called.
    """
    return output_graph.fake_calls.enabled and output_graph.fake_calls.guards_filtered


def run_fake_calls_apart(
    output_graph: "OutputGraph",
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    call_user_compiler: Callable[[fx.GraphModule, Sequence[Any]], Callable[..., Any]],
) -> Callable[..., Any]:
    """
    A real entry whose guards a guard_filter_fn filtered may be hit by a fake
    call: that call runs the captured graph op by op under its mode instead
    of the backend's artifact (which may read FakeTensors' data). A call is
    fake if a fake mode is active or a tensor it passes is a FakeTensor.
    Nothing more is kept for such calls, which users of guard filters who
    never call under fake would pay for: they predict eager's memory, not the
    compiled run's, and say so once.
    """
    runtime = make_runtime(gm)
    compiled_fn = _forced_lazy_forward(call_user_compiler(gm, example_inputs))
    tensor_inputs = [i for i, arg in enumerate(output_graph.graphargs) if arg.is_tensor]
    get_mode = torch._C._get_dispatch_mode
    fake_key = torch._C._TorchDispatchModeKey.FAKE
    warned = False

    def run_fake_call(*args: Any) -> Any:
        nonlocal warned
        if not warned:
            warned = True
            log.warning(
                "A fake call is served by an entry compiled for real calls under "
                "a guard_filter_fn: it runs the captured graph op by op (eager's "
                "saved tensors, not the compiled run's). Make the first call "
                "under the FakeTensorMode for the compiled run's."
            )
        return runtime(*args)

    # Every real call pays this check: the tensor inputs' types are looked
    # up in C (itemgetter, map), not in a Python loop.
    if len(tensor_inputs) > 1:
        tensors = operator.itemgetter(*tensor_inputs)

        def run(*args: Any) -> Any:
            if get_mode(fake_key) is None and FakeTensor not in map(type, tensors(args)):
                return compiled_fn(*args)
            return run_fake_call(*args)

    elif tensor_inputs:
        (index,) = tensor_inputs

        def run(*args: Any) -> Any:
            if get_mode(fake_key) is None and type(args[index]) is not FakeTensor:
                return compiled_fn(*args)
            return run_fake_call(*args)

    else:

        def run(*args: Any) -> Any:
            if get_mode(fake_key) is None:
                return compiled_fn(*args)
            return run_fake_call(*args)

    return run


def _forced_lazy_forward(compiled_fn: Callable[..., Any]) -> Callable[..., Any]:
    """
    The real forward of a _LazyGraphModule a backend returns, as Dynamo takes
    it when the backend's answer is not wrapped: calling the lazy one goes
    through nn.Module.__call__ on every call.
    """
    from torch.fx._lazy_graph_module import _LazyGraphModule

    lazy_gm = getattr(compiled_fn, "__self__", compiled_fn)
    if isinstance(lazy_gm, _LazyGraphModule) and (
        compiled_fn is lazy_gm or compiled_fn.__name__ == "_lazy_forward"
    ):
        _LazyGraphModule.force_recompile(lazy_gm)
        return lazy_gm.forward
    return compiled_fn
