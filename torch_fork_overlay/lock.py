"""One run at a time: an exclusive lock per install (apply, revert) and per
patches folder (refresh), held with ``filelock`` (``flock`` on Linux).

A second run waits for the first (up to ``$TORCH_FORK_OVERLAY_LOCK_TIMEOUT``
seconds, default 60, saying so once) and then refuses with an
``OverlayError``.  The kernel drops a ``flock`` when its process dies, so a
killed run never leaves a lock that blocks the next one.

The lock file (``.torch-fork-overlay.lock``, next to ``torch/`` in
site-packages, or in the patches folder) is removed at the end of every run
*while the lock is still held*: a run that opened the old file and gets the
lock after us finds it unlinked and retries on a fresh file (filelock checks
``st_nlink`` after ``flock`` for exactly this), so removing it never lets two
runs in at once and a finished run leaves no file behind.  After a kill the
file stays until the next run; it is never importable and pip ignores it.
This needs a filelock whose release does not unlink the file itself
(3.20.4 up to the fix of its issue #574 did, racing with waiters) and which
re-checks ``st_nlink`` after ``flock``: 4.3 or later (setup.py).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock, Timeout

from .errors import OverlayError
from .journal import step

ENV_TIMEOUT = "TORCH_FORK_OVERLAY_LOCK_TIMEOUT"
DEFAULT_TIMEOUT = 60.0


def _timeout() -> float:
    raw = os.environ.get(ENV_TIMEOUT)
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        return float(raw)
    except ValueError:
        raise OverlayError(
            f"${ENV_TIMEOUT}={raw!r} is not a number of seconds",
            cause="the environment variable is mistyped",
            next=f"unset {ENV_TIMEOUT} or set it to e.g. 120",
        ) from None


@contextlib.contextmanager
def exclusive(
    lock_path: Path,
    *,
    what: str,
    out: Callable[[str], None],
    unwritable: Callable[[OSError], OverlayError],
) -> Iterator[None]:
    """Hold the lock ``lock_path`` guarding ``what`` (words for messages).
    ``unwritable(e)`` is the error raised when the lock file cannot be created."""
    timeout = _timeout()
    lock = FileLock(str(lock_path))
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            out(f"waiting up to {timeout:g}s for {lock_path}: another torch_fork_overlay run "
                f"is changing {what}")
            lock.acquire(timeout=timeout)
    except Timeout:
        raise OverlayError(
            f"another torch_fork_overlay run has held {lock_path} for more than {timeout:g}s "
            f"while changing {what}; nothing was changed",
            cause="an apply, revert or refresh of the same target is still running, or is stopped "
            "(find it with: ps -ef | grep torch_fork_overlay)",
            next=f"let it finish and rerun the same command (or wait longer: {ENV_TIMEOUT}=600)",
        ) from None
    except OSError as e:
        raise unwritable(e) from None
    try:
        yield
    finally:
        try:
            step("unlock", lock_path, can_fail=False)
            lock_path.unlink(missing_ok=True)
        except OSError:
            pass  # a leftover lock file blocks nobody; the next run removes it
        finally:
            lock.release()


def held_elsewhere(lock_path: Path) -> bool | None:
    """Whether another process holds ``lock_path`` now (None: cannot tell,
    e.g. a read-only install).  A stale lock file of a killed run is removed."""
    if not lock_path.exists():
        return False
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return True
    except OSError:
        return None
    try:
        lock_path.unlink(missing_ok=True)
    except OSError:
        pass
    finally:
        lock.release()
    return False
