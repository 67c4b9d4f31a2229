"""The one place the tool runs subprocesses.

Output is captured; on failure an ``OverlayError`` names the command, its
exit status, the tail of its output and the path of a full log file.

Each child runs in its own process group.  If the tool is interrupted
(Ctrl-C, or SIGTERM / SIGHUP, which ``raise_on_termination`` turns into
``Terminated``) while a child runs, the whole group is terminated (then
killed) before the exception goes on, so ``with TemporaryDirectory()``
blocks above can remove what the child was writing.  On Linux a child also
gets SIGKILL when the tool itself is SIGKILLed (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
from typing import Mapping, Sequence

from .errors import OverlayError

_TAIL_LINES = 20
_GRACE_S = 5.0


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C's KeyboardInterrupt so that every
    cleanup (temp dirs, child process groups, roll-backs) runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_on_termination() -> None:
    """Make SIGTERM and SIGHUP raise ``Terminated`` in the main thread."""

    def handler(signum, frame):
        raise Terminated(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def _log_dir() -> str:
    d = os.environ.get("TORCH_FORK_OVERLAY_LOG_DIR") or os.path.join(
        tempfile.gettempdir(), "torch-fork-overlay-logs"
    )
    os.makedirs(d, exist_ok=True)
    return d


def _pdeathsig():
    """A preexec_fn giving the child SIGKILL when the tool dies (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the child
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the tool died before prctl took effect
            os._exit(1)

    return preexec


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the child's process group, SIGKILL it after a grace period."""
    for sig, wait in ((signal.SIGTERM, _GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # the leader is gone; make sure no member of its group is left
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(
    cmd: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    input: str | None = None,
    what: str | None = None,
    cause: str | None = None,
    next: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (a list, never a shell string) and capture its output.

    ``env`` entries are added to (not substituted for) ``os.environ``.
    With ``check=True`` a non-zero exit raises ``OverlayError``; ``what``,
    ``cause`` and ``next`` override the generic three parts of that error.
    Returns the ``CompletedProcess`` (``stdout`` and ``stderr`` as text).
    """
    cmd = [os.fspath(c) for c in cmd]
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=full_env, text=True, start_new_session=True,
            preexec_fn=_pdeathsig(),
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
    except OSError as e:
        raise OverlayError(
            f"could not start {cmd[0]!r} ({shlex.join(cmd)}): {e.strerror}",
            cause="the program is not installed or not on PATH"
            if isinstance(e, FileNotFoundError) else "the path is not an executable program",
            next=f"install {os.path.basename(cmd[0])} or pass its full path",
        ) from None
    try:
        stdout, stderr = proc.communicate(input)
    except BaseException:
        _stop_group(proc)
        raise
    cp = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    if check and cp.returncode != 0:
        tail = "\n".join(
            ("    " + line)
            for line in (cp.stdout + cp.stderr).strip().splitlines()[-_TAIL_LINES:]
        )
        log = _write_log(cmd, cwd, cp)
        raise OverlayError(
            (what or f"command failed with exit status {cp.returncode}: {shlex.join(cmd)}")
            + (f"\n{tail}" if tail else "")
            + f"\n  full log: {log}",
            cause=cause or "see the output above",
            next=next or f"read {log}, fix the cause and rerun",
        )
    return cp


def _write_log(cmd: list[str], cwd, cp: subprocess.CompletedProcess[str]) -> str:
    log = None
    try:
        fd, log = tempfile.mkstemp(prefix="run-", suffix=".log", dir=_log_dir())
        with os.fdopen(fd, "w") as f:
            f.write(f"$ {shlex.join(cmd)}\n# cwd: {cwd or os.getcwd()}\n")
            f.write(f"# exit status: {cp.returncode}\n--- stdout ---\n{cp.stdout}")
            f.write(f"--- stderr ---\n{cp.stderr}")
        return log
    except OSError as e:
        if log:
            try:
                os.unlink(log)
            except OSError:
                pass
        return f"(none: could not write one: {e.strerror})"
