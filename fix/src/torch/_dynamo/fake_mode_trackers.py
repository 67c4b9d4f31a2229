"""
fullgraph=True for frames a dispatch mode makes Dynamo skip, under a user's
FakeTensorMode. See Note [Inheriting the ambient FakeTensorMode] in
ambient_fake_mode.py.
"""

import logging

from . import fake_mode_compat
from .ambient_fake_mode import users_fake_mode


log = logging.getLogger(__name__)
_logged = False


def frames_run_eagerly_under_modes() -> bool:
    """
    Whether a fullgraph=True call that compiled no frame ran them eagerly on
    purpose: under a user's FakeTensorMode, a non-infra dispatch mode (a
    tracker such as FlopCounterMode, MemTracker or CommDebugMode) makes Dynamo
    skip frames, which run eagerly under the modes, as on stock, so the
    tracker sees their ops and their modules' hooks. That eager run is what
    the call is for (an estimate): fullgraph=True does not fail with "found
    no compiled frames" for it.
    """
    if (
        users_fake_mode() is None
        or not fake_mode_compat.dynamo_skips_for_dispatch_mode()
    ):
        return False
    global _logged
    if not _logged:
        _logged = True
        log.info(
            "fullgraph=True under a FakeTensorMode: frames a dispatch mode makes "
            "Dynamo skip ran eagerly under the modes instead of failing"
        )
    return True
