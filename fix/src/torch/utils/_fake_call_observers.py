"""
What the trackers (FlopCounterMode, MemTracker, ModuleTracker, ModTracker) ask
of a call of compiled code under a user's FakeTensorMode that is shown to
them. See Note [Trackers see the compiled run of a fake call] in
torch/_dynamo/fake_mode_trackers.py. Nothing here imports Dynamo: a process
that never compiles never loads it, and then every answer is no.
"""

import sys
from typing import Any


def _trackers() -> Any:
    return sys.modules.get("torch._dynamo.fake_mode_trackers")


def shows_compiled_run(cls: Any = None) -> bool:
    """A tracker mode's ignore_compile_internals(): true while this thread
    makes a fake call shown to trackers (Dynamo compiles with the modes off
    and the graphs run under them)."""
    trackers = _trackers()
    return trackers is not None and trackers.shows_compiled_run()


def skips_call(tracker: Any, module: Any) -> bool:
    """Whether a module tracker's hook ignores this call of module, in a fake
    call shown to trackers: a tracer's call of the module, a compiled graph's
    call of its own subgraph, or another thread's call."""
    trackers = _trackers()
    return trackers is not None and trackers.skips_module_call(tracker, module)
