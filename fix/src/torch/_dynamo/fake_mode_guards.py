"""
Real and fake calls of a compiled frame never share a cache entry.
See Note [Inheriting the ambient FakeTensorMode] in ambient_fake_mode.py.
"""

from collections.abc import Callable, Sequence
from typing import Any, TYPE_CHECKING

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor

from .ambient_fake_mode import has_fake_tensor_input, make_runtime, state


if TYPE_CHECKING:
    from .output_graph import OutputGraph


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
    TENSOR_MATCH checks a tensor input's type, so an entry compiled with a
    FakeTensor input is never hit by a real call, nor a real entry by a call
    with a FakeTensor argument. Entries without such an input guard on whether
    a fake mode is active (FAKE_TENSOR_MODE): a fake entry without FakeTensor
    inputs, and a real entry none of whose tensor inputs the frame was called
    with (a module with real parameters called with an int), which a call
    under a FakeTensorMode(allow_non_fake_inputs=True) would otherwise hit.
    """
    fake_calls = output_graph.fake_calls
    if not fake_calls.enabled:
        return False
    if fake_calls.is_compiling_for_fake(output_graph):
        return not has_fake_tensor_input(output_graph)
    return not _frame_tensor_inputs(output_graph)


def compiled_for_fake_calls(output_graph: Any) -> bool:
    """Whether CheckFunctionManager guards an entry compiled for fake calls
    (output_graph may be a deserialized guards state, which never is)."""
    fake_calls = getattr(output_graph, "fake_calls", None)
    return fake_calls is not None and fake_calls.compiled_for_fake


def is_fake_entry(cache_entry: Any) -> bool:
    return getattr(cache_entry.guard_manager, "compiled_for_fake_calls", False)


def is_fake_call(frame: Any) -> bool:
    """
    Whether the frame being compiled was called for fake: under a user's
    FakeTensorMode or with one of its FakeTensors among its locals (or in a
    tuple, list or dict there, such as *args). A dry run under a FakeTensorMode
    must not change what later real calls do, so real and fake entries of a
    frame count toward their own recompile limits.
    """
    if not state.enabled:
        return False
    if state.mode is not None:
        return True
    for value in frame.f_locals.values():
        if isinstance(value, (tuple, list)):
            values: Any = value
        elif isinstance(value, dict):
            values = value.values()
        else:
            values = (value,)
        if any(isinstance(v, FakeTensor) for v in values):
            return True
    return False


def needs_fake_calls_told_apart(output_graph: "OutputGraph") -> bool:
    """
    A guard_filter_fn may drop the guards that keep a real entry from fake
    calls: such an entry tells them apart when called.
    """
    return output_graph.fake_calls.enabled and output_graph.fake_calls.guards_filtered


def run_fake_calls_apart(
    output_graph: "OutputGraph",
    gm: fx.GraphModule,
    compiled_fn: Callable[..., Any],
) -> Callable[..., Any]:
    """
    A real entry whose guards a guard_filter_fn filtered may be hit by a fake
    call: that call runs the graph for fake instead of the backend's artifact.
    A call is fake if a fake mode is active or one of the frame's own tensor
    inputs (not parameters, which there may be many of) is a FakeTensor.
    """
    runtime = make_runtime(gm)
    input_indices: Sequence[int] = _frame_tensor_inputs(output_graph)
    get_mode = torch._C._get_dispatch_mode
    fake_key = torch._C._TorchDispatchModeKey.FAKE

    def run(*args: Any) -> Any:
        if get_mode(fake_key) is not None or any(
            isinstance(args[i], FakeTensor) for i in input_indices
        ):
            return runtime(*args)
        return compiled_fn(*args)

    return run
