"""
Frames called under a user's FakeTensorMode and a dispatch mode that only
observes ops are compiled. See Note [Inheriting the ambient FakeTensorMode]
in ambient_fake_mode.py.
"""

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from . import config
from .ambient_fake_mode import tracer_owns_call


# Dispatch modes PyTorch ships that only observe the ops they see (and their
# subclasses, e.g. FSDPMemTracker), by the names their classes report.
_OBSERVER_DISPATCH_MODES = frozenset(
    {
        "torch.distributed._tools.mem_tracker.MemTracker",
        "torch.distributed._tools.runtime_estimator.RuntimeEstimator",
        "torch.distributed._tools.sac_estimator.SACEstimator",
        "torch.distributed.tensor.debug.CommDebugMode",
        "torch.utils.flop_counter._FlopCounterMode",
    }
)


def compiles_under_observer_modes() -> bool:
    """
    Whether a frame called under a user's FakeTensorMode is compiled although
    non-infra dispatch modes are active: they only observe ops, so tracing
    without them is right, and the graph runs op by op under them.
    """
    if (
        not config.inherit_ambient_fake_mode
        or torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None
        or tracer_owns_call()
    ):
        return False
    modes = _get_current_dispatch_mode_stack()
    if all(mode.is_infra_mode() or mode.ignore_compile_internals() for mode in modes):
        # A mode runs its own __torch_dispatch__ off the stack. If no mode on
        # the stack is why Dynamo skips this frame, the frame runs inside one:
        # keep it skipped.
        return False
    return all(
        mode.is_infra_mode()
        or mode.ignore_compile_internals()
        or any(
            f"{cls.__module__}.{cls.__qualname__}" in _OBSERVER_DISPATCH_MODES
            for cls in type(mode).__mro__
        )
        for mode in modes
    )
