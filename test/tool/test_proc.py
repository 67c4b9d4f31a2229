"""proc.run: the one place subprocesses run; failures name command, status, log."""

from __future__ import annotations

import re
import signal
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


def test_oserror_starting_a_program_is_an_overlay_error(tmp_path):
    with pytest.raises(OverlayError, match=r"could not start .*: Permission denied"):
        run([str(tmp_path)])  # a directory


# -- a killed `wheel` leaves no child process and no temp dir ----------------

FAKE_WHEEL_MAIN = """\
import os, subprocess, sys, time
grandchild = subprocess.Popen(["sleep", "300"])
with open(os.environ["TFO_TEST_PIDS"], "w") as f:
    f.write(f"{os.getpid()} {grandchild.pid}\\n")
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _start_wheel(tmp_path, synth):
    """`wheel` whose `python -m wheel unpack` child is a fake that sleeps
    (and has a child of its own); returns (process, out dir, child pids)."""
    import os
    import subprocess
    import time
    import zipfile

    from conftest import REPO

    _, pdir = synth
    fake = tmp_path / "fake"
    (fake / "wheel").mkdir(parents=True)
    (fake / "wheel" / "__init__.py").write_text("")
    (fake / "wheel" / "__main__.py").write_text(FAKE_WHEEL_MAIN)
    whl = tmp_path / "torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("torch/__init__.py", "")
    out, pids = tmp_path / "dist", tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": str(fake), "TFO_TEST_PIDS": str(pids)}
    # Started as from a terminal: a test run in the background (`.ci/run &`, nohup) inherits SIGINT ignored, and
    # Python then keeps ignoring it, as a background job should.
    proc = subprocess.Popen([sys.executable, "-m", "torch_fork_overlay", "wheel", "--wheel", str(whl),
                             "--out-dir", str(out), "--patches-dir", str(pdir)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 30
    while not (pids.exists() and pids.read_text().endswith("\n")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    child, grandchild = map(int, pids.read_text().split())
    assert [p.name.startswith(f"tfo-wheel-{proc.pid}-") for p in out.iterdir()] == [True]
    return proc, out, child, grandchild


def _wait_dead(*pids: int) -> bool:
    import time

    deadline = time.monotonic() + 15
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(map(_alive, pids))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_wheel_interrupted_stops_its_children_and_removes_its_temp_dir(tmp_path, synth, sig):
    proc, out, child, grandchild = _start_wheel(tmp_path, synth)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, err
    assert err.startswith(f"error: interrupted by {signal.Signals(sig).name}\n"), err
    assert _wait_dead(child, grandchild)
    assert list(out.iterdir()) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_wheel_sigkilled_child_dies_and_next_run_removes_the_temp_dir(tmp_path, synth):
    import os

    proc, out, child, grandchild = _start_wheel(tmp_path, synth)
    try:
        proc.kill()
        proc.communicate(timeout=30)
        assert _wait_dead(child)
    finally:
        try:
            os.killpg(child, signal.SIGKILL)  # the fake's own child is not ours to stop after a SIGKILL
        except ProcessLookupError:
            pass
    (stale,) = out.iterdir()
    _, pdir = synth
    from torch_fork_overlay.wheel import build_wheel

    with pytest.raises(OverlayError):  # the fake wheel file does not unpack; the stale dir goes first
        build_wheel(wheel_path=tmp_path / "torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                    out_dir=out, patches_dir=pdir)
    assert list(out.iterdir()) == []
