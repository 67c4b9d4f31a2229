"""
Frames a tracker mode makes Dynamo skip, under a user's FakeTensorMode.
See Note [Inheriting the ambient FakeTensorMode] in ambient_fake_mode.py.
"""

import logging

import torch

from . import config
from .ambient_fake_mode import tracer_owns_call


log = logging.getLogger(__name__)
_logged = False


def serve_skipped_frame_eagerly() -> None:
    """
    Called when Dynamo skips a frame because a non-infra dispatch mode (a
    tracker such as FlopCounterMode, MemTracker or CommDebugMode) is active.
    The frame runs eagerly under the modes, as on stock, so trackers see its
    ops and its modules' hooks. Under a user's FakeTensorMode that eager run is
    what the call is for (an estimate), so fullgraph=True does not fail with
    "found no compiled frames" for it: the frame counts as served.
    """
    if (
        not config.inherit_ambient_fake_mode
        or torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None
        or tracer_owns_call()
    ):
        return
    from torch._C._dynamo.eval_frame import set_fullgraph_compiled_frame_count

    # The count is -1 unless a fullgraph=True call is counting its frames.
    count = set_fullgraph_compiled_frame_count(-1)
    set_fullgraph_compiled_frame_count(count + 1 if count >= 0 else count)
    global _logged
    if count >= 0 and not _logged:
        _logged = True
        log.info(
            "fullgraph=True under a FakeTensorMode: frames a dispatch mode makes "
            "Dynamo skip run eagerly under the modes instead of failing"
        )
