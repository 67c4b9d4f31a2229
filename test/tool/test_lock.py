"""One run per install: two processes on one (synthetic) install.

The first run is held mid-change deterministically: ``TFO_FAULT_AT=N:stop``
makes it SIGSTOP itself at its N-th durable step, lock held, journal written.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, tree_digest
from test_crash_safety import Install, assert_record_matches_files, tfo
from torch_fork_overlay import state as st

if not Path("/proc/self/stat").exists():
    pytest.skip("needs /proc to see a stopped process", allow_module_level=True)


@pytest.fixture
def install(synth, tmp_path) -> Install:
    sp, pdir = synth
    return Install(sp, pdir, tmp_path / "snapshots")


def start(install: Install, op: str, *, env: dict[str, str] | None = None) -> subprocess.Popen:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TFO_FAULT")}
    full.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "torch_fork_overlay", op, *install.args], cwd=REPO,
                            env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_stopped(install: Install, op: str, step_name: str) -> subprocess.Popen:
    """``op`` stopped (SIGSTOP) just before its step ``step_name`` ('replace .../_guards.py')."""
    steps = install.steps(op)
    n = next(i for i, s in enumerate(steps, 1) if s.split(" ", 1)[1].startswith(step_name))
    proc = start(install, op, env={"TFO_FAULT_AT": f"{n}:stop"})
    deadline = time.monotonic() + 30
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    return proc


def read_until(proc: subprocess.Popen, text: str, timeout: float = 30) -> str:
    seen = ""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while text not in seen:
        assert time.monotonic() < deadline and sel.select(timeout=1) is not None, seen
        line = proc.stdout.readline()
        assert line, (seen, proc.communicate())
        seen += line
    return seen


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_two_applies_at_once(install):
    first = start_stopped(install, "apply", f"replace {install.sp}/torch/_guards.py")
    second = start(install, "apply")
    read_until(second, "waiting up to 60s for ")
    assert "apply in progress: another torch_fork_overlay run holds" in install.status()
    first.send_signal(signal.SIGCONT)
    rc1, out1, err1 = finish(first)
    rc2, out2, err2 = finish(second)
    assert (rc1, rc2) == (0, 0), (err1, err2)
    assert "applied 2 patch(es)" in out1
    assert "already applied:" in out2
    # the backups hold the pristine bytes, RECORD has no duplicate rows
    assert tree_digest(install.sp) == install.applied
    assert_record_matches_files(install.sp)


def test_apply_during_revert(install):
    install.reset("applied")
    first = start_stopped(install, "revert", f"replace {install.sp}/torch/_guards.py")
    second = start(install, "apply")
    read_until(second, "waiting up to 60s for ")
    first.send_signal(signal.SIGCONT)
    assert finish(first)[0] == 0
    rc, out, err = finish(second)
    assert rc == 0, err
    assert "applied 2 patch(es)" in out
    assert tree_digest(install.sp) == install.applied


def test_revert_during_apply(install):
    first = start_stopped(install, "apply", f"write {install.sp}/torch/._fork_overlay_state.json")
    second = start(install, "revert")
    read_until(second, "waiting up to 60s for ")
    first.send_signal(signal.SIGCONT)
    assert finish(first)[0] == 0
    rc, out, err = finish(second)
    assert rc == 0, err
    assert out.rstrip().endswith("to pristine (2 file(s) restored, hash-checked)")
    assert tree_digest(install.sp) == install.pristine


def test_second_run_refuses_after_the_timeout(install):
    first = start_stopped(install, "apply", f"replace {install.sp}/torch/_guards.py")
    try:
        before = tree_digest(install.sp)
        cp = tfo("revert", *install.args, env={"TORCH_FORK_OVERLAY_LOCK_TIMEOUT": "0.5"})
        lock = install.sp / st.LOCK_NAME
        assert cp.returncode == 2
        assert cp.stderr == (
            f"error: another torch_fork_overlay run has held {lock} for more than 0.5s while "
            f"changing torch 2.15.0+cu132 at {install.sp / 'torch'}; nothing was changed\n"
            "  likely cause: an apply, revert or refresh of the same target is still running, or is "
            "stopped (find it with: ps -ef | grep torch_fork_overlay)\n"
            "  next: let it finish and rerun the same command (or wait longer: "
            "TORCH_FORK_OVERLAY_LOCK_TIMEOUT=600)\n"
        )
        assert tree_digest(install.sp) == before
    finally:
        first.send_signal(signal.SIGCONT)
    assert finish(first)[0] == 0
    assert tree_digest(install.sp) == install.applied


def test_many_runs_at_once_stay_consistent(install):
    procs = [start(install, op) for op in ("apply", "revert", "apply", "revert", "apply", "apply")]
    results = [finish(p) for p in procs]
    for rc, out, err in results:
        assert rc in (0, 2), err
        assert "Traceback" not in err
        if rc == 2:
            assert err.startswith("error: nothing to revert"), err
    assert tree_digest(install.sp) in (install.pristine, install.applied)
    assert_record_matches_files(install.sp)


def test_sigterm_mid_apply_rolls_back(install):
    """SIGTERM (not SIGKILL) is handled: the run rolls back before exiting."""
    first = start_stopped(install, "apply", f"replace {install.sp}/torch/_guards.py")
    first.send_signal(signal.SIGTERM)
    first.send_signal(signal.SIGCONT)
    rc, out, err = finish(first)
    assert rc == 128 + signal.SIGTERM
    assert f"interrupted: rolled back, torch at {install.sp / 'torch'} is unchanged" in out
    assert err.startswith("error: interrupted by SIGTERM\n")
    assert tree_digest(install.sp) == install.pristine


def test_sigterm_mid_revert_is_finished_by_the_next_revert(install):
    install.reset("applied")
    first = start_stopped(install, "revert", f"replace {install.sp}/torch/_guards.py")
    first.send_signal(signal.SIGTERM)
    first.send_signal(signal.SIGCONT)
    rc, out, err = finish(first)
    assert rc == 128 + signal.SIGTERM, err
    assert "journal:       interrupted revert: " in install.status()
    cp = tfo("revert", *install.args)
    assert cp.returncode == 0, cp.stderr
    assert tree_digest(install.sp) == install.pristine


def _hammer(lock_path: str, log: str, rounds: int) -> None:
    from torch_fork_overlay.lock import exclusive

    for _ in range(rounds):
        with exclusive(Path(lock_path), what="a test", out=lambda s: None, unwritable=lambda e: e):
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                os.write(fd, b"(")
                time.sleep(0.001)
                os.write(fd, b")")
            finally:
                os.close(fd)


def test_lock_file_removed_while_held_stays_exclusive(tmp_path):
    """Each holder removes the lock file before releasing it; four processes
    taking turns never overlap and no lock file is left."""
    import multiprocessing

    lock_path, log = tmp_path / "x.lock", tmp_path / "log"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hammer, args=(str(lock_path), str(log), 40)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert log.read_text() == "()" * 160
    assert not lock_path.exists()
