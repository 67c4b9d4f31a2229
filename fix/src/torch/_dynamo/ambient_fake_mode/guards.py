"""
Real and fake calls of a compiled frame never share a cache entry.
See Note [Inheriting the ambient FakeTensorMode] in __init__.py.
"""

from collections.abc import Callable, Sequence
from typing import Any, TYPE_CHECKING

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor

from . import has_fake_tensor_input, make_runtime, state


if TYPE_CHECKING:
    from ..output_graph import OutputGraph


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


def needs_fake_tensor_mode_guard(output_graph: "OutputGraph") -> bool:
    """
    TENSOR_MATCH checks a tensor input's type, so an entry compiled with a
    FakeTensor input is never hit by a real call, nor a real entry by a call
    with a FakeTensor input. Only entries without such an input guard on
    whether a fake mode is active (FAKE_TENSOR_MODE).
    """
    fake_calls = output_graph.fake_calls
    if not fake_calls.enabled:
        return False
    if fake_calls.is_compiling_for_fake(output_graph):
        return not has_fake_tensor_input(output_graph)
    return not any(arg.is_tensor for arg in output_graph.graphargs)


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
    from ..source import LocalSource

    runtime = make_runtime(gm)
    input_indices: Sequence[int] = [
        i
        for i, arg in enumerate(output_graph.graphargs)
        if arg.is_tensor and isinstance(arg.source, LocalSource)
    ]
    get_mode = torch._C._get_dispatch_mode
    fake_key = torch._C._TorchDispatchModeKey.FAKE

    def run(*args: Any) -> Any:
        if get_mode(fake_key) is not None or any(
            isinstance(args[i], FakeTensor) for i in input_indices
        ):
            return runtime(*args)
        return compiled_fn(*args)

    return run
