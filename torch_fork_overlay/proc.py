"""The one place the tool runs subprocesses.

Output is captured; on failure an ``OverlayError`` names the command, its
exit status, the tail of its output and the path of a full log file.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from typing import Mapping, Sequence

from .errors import OverlayError

_TAIL_LINES = 20


def _log_dir() -> str:
    d = os.environ.get("TORCH_FORK_OVERLAY_LOG_DIR") or os.path.join(
        tempfile.gettempdir(), "torch-fork-overlay-logs"
    )
    os.makedirs(d, exist_ok=True)
    return d


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
        cp = subprocess.run(
            cmd,
            cwd=cwd,
            env=full_env,
            input=input,
            text=True,
            capture_output=True,
        )
    except FileNotFoundError as e:
        raise OverlayError(
            f"could not start {cmd[0]!r} ({shlex.join(cmd)})",
            cause=f"{e.strerror}: the program is not installed or not on PATH",
            next=f"install {os.path.basename(cmd[0])} or pass its full path",
        ) from None
    if check and cp.returncode != 0:
        fd, log = tempfile.mkstemp(prefix="run-", suffix=".log", dir=_log_dir())
        with os.fdopen(fd, "w") as f:
            f.write(f"$ {shlex.join(cmd)}\n# cwd: {cwd or os.getcwd()}\n")
            f.write(f"# exit status: {cp.returncode}\n--- stdout ---\n{cp.stdout}")
            f.write(f"--- stderr ---\n{cp.stderr}")
        tail = "\n".join(
            ("    " + line)
            for line in (cp.stdout + cp.stderr).strip().splitlines()[-_TAIL_LINES:]
        )
        raise OverlayError(
            (what or f"command failed with exit status {cp.returncode}: {shlex.join(cmd)}")
            + (f"\n{tail}" if tail else "")
            + f"\n  full log: {log}",
            cause=cause or "see the output above",
            next=next or f"read {log}, fix the cause and rerun",
        )
    return cp
