"""proc.run: the one place subprocesses run; failures name command, status, log."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from torch_fork_overlay.errors import OverlayError
from torch_fork_overlay.proc import run


def test_failure_names_command_status_and_log(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_FORK_OVERLAY_LOG_DIR", str(tmp_path))
    with pytest.raises(OverlayError) as e:
        run([sys.executable, "-c", "import sys; print('out'); sys.exit('boom')"])
    msg = str(e.value)
    assert msg.startswith(f"error: command failed with exit status 1: {sys.executable} -c ")
    assert "\n    out\n    boom\n" in msg
    log = Path(re.search(r"full log: (\S+)", msg).group(1))
    assert log.parent == tmp_path
    assert "# exit status: 1" in log.read_text() and "boom" in log.read_text()
    assert msg.endswith(f"  next: read {log}, fix the cause and rerun")


def test_missing_program():
    with pytest.raises(OverlayError, match=r"could not start 'no-such-program-tfo'"):
        run(["no-such-program-tfo"])


def test_env_is_added_not_substituted():
    cp = run([sys.executable, "-c", "import os; print(os.environ['TFO_X'], 'PATH' in os.environ)"],
             env={"TFO_X": "1"})
    assert cp.stdout == "1 True\n"
