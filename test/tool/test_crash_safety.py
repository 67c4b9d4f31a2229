"""Crash safety, by fault injection on a synthetic install (no torch needed).

``TFO_FAULT_AT=N`` makes the tool SIGKILL itself at its N-th durable step
(every temp-file write, rename, unlink; see torch_fork_overlay/journal.py).
Each test enumerates N = 1, 2, ... until the run completes, and after every
kill checks that

* ``pip uninstall torch`` would leave nothing of ours in torch/ or the dist-info;
* ``status`` says what happened;
* the next ``apply`` ends byte-identical to a clean apply, the next ``revert``
  byte-identical to pristine (the whole site-packages: files, modes, RECORD,
  no temp, lock or journal file left), and RECORD matches the files.
"""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, SYNTH_DIST_INFO, tree_digest
from torch_fork_overlay import state as st
from torch_fork_overlay.apply import apply_to_install, revert_install
from torch_fork_overlay.errors import OverlayError
from torch_fork_overlay.status import status_report

KILLED = -signal.SIGKILL


def tfo(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TFO_FAULT")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "torch_fork_overlay", *args], cwd=REPO, env=full,
                          capture_output=True, text=True, **kw)


def quiet(_: str) -> None:
    pass


def record_rows(sp: Path) -> list[list[str]]:
    with open(sp / SYNTH_DIST_INFO / "RECORD", newline="", encoding="utf-8") as f:
        return [row for row in csv.reader(f) if row]


def assert_record_matches_files(sp: Path) -> None:
    """Every RECORD hash matches its file; every file of torch/ and the dist-info is listed."""
    rows = record_rows(sp)
    paths = [r[0] for r in rows]
    assert len(paths) == len(set(paths)), "duplicate RECORD rows"
    for path, digest, size in rows:
        if digest:
            data = (sp / path).read_bytes()
            assert (digest, size) == (st.record_hash(data), str(len(data))), path
        else:
            assert path.endswith("/RECORD"), f"RECORD lists {path} without a hash"
    on_disk = [p.relative_to(sp).as_posix() for top in ("torch", SYNTH_DIST_INFO)
               for p in (sp / top).rglob("*") if not p.is_dir()]
    assert sorted(set(on_disk) - set(paths)) == []


def pip_uninstall_leaves(sp: Path, scratch: Path) -> list[str]:
    """What ``pip uninstall torch`` would leave (it removes RECORD's files and
    then the folders left empty), run on a copy."""
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(sp, scratch, symlinks=True)
    for path, *_ in record_rows(scratch):
        (scratch / path).unlink(missing_ok=True)
    for top in ("torch", SYNTH_DIST_INFO):
        for d in sorted((p for p in (scratch / top).rglob("*") if p.is_dir()), reverse=True):
            if not any(d.iterdir()):
                d.rmdir()
        if (scratch / top).is_dir() and not any((scratch / top).iterdir()):
            (scratch / top).rmdir()
    return sorted(p.relative_to(scratch).as_posix() for p in scratch.rglob("*"))


class Install:
    """The synthetic install at one fixed path (the state file names that
    path), with snapshots to reset it to."""

    def __init__(self, sp: Path, pdir: Path, tmp: Path) -> None:
        self.sp, self.pdir, self.tmp = sp, pdir, tmp
        self.args = ["--site-packages", str(sp), "--patches-dir", str(pdir)]
        self.pristine = tree_digest(sp)
        self.snapshot("pristine")
        apply_to_install(site_packages=sp, patches_dir=pdir, out=quiet)
        self.applied = tree_digest(sp)
        self.snapshot("applied")
        self.reset("pristine")

    def snapshot(self, name: str) -> None:
        shutil.rmtree(self.tmp / name, ignore_errors=True)
        shutil.copytree(self.sp, self.tmp / name, symlinks=True)

    def reset(self, name: str) -> None:
        shutil.rmtree(self.sp)
        shutil.copytree(self.tmp / name, self.sp, symlinks=True)

    def apply(self) -> str:
        return apply_to_install(site_packages=self.sp, patches_dir=self.pdir, out=quiet)

    def revert(self) -> str:
        try:
            return revert_install(site_packages=self.sp, patches_dir=self.pdir, out=quiet)
        except OverlayError as e:  # a kill before the journal of an apply existed
            assert e.what.startswith("nothing to revert"), e
            return e.what

    def status(self) -> str:
        return status_report(site_packages=self.sp, patches_dir=self.pdir)

    def steps(self, op: str) -> list[str]:
        """The durable steps of a clean ``op`` from the current state (then reset)."""
        log = self.tmp / "steps.log"
        log.unlink(missing_ok=True)
        self.snapshot("before-steps")
        assert tfo(op, *self.args, env={"TFO_FAULT_LOG": str(log)}).returncode == 0
        self.reset("before-steps")
        return log.read_text().splitlines()

    def check_recoveries(self, killed: str, op: str) -> None:
        """From snapshot ``killed``: status, pip uninstall, then apply / revert."""
        journal = (self.sp / "torch" / st.JOURNAL_NAME).exists()
        assert pip_uninstall_leaves(self.sp, self.tmp / "uninstalled") == [
            p for p in [st.RECORD_TMP_NAME, st.LOCK_NAME] if (self.sp / p).exists()]
        report = self.status()
        if journal:
            assert f"journal:       interrupted {op}: " in report
        for recover, want in ((self.apply, self.applied), (self.revert, self.pristine)):
            self.reset(killed)
            recover()
            assert tree_digest(self.sp) == want, (killed, recover.__name__)
            assert_record_matches_files(self.sp)
            assert "journal:" not in self.status()


@pytest.fixture
def install(synth, tmp_path) -> Install:
    sp, pdir = synth
    return Install(sp, pdir, tmp_path / "snapshots")


@pytest.mark.parametrize("op", ["apply", "revert"])
def test_killed_at_every_step_then_recovered(install, op):
    start = "pristine" if op == "apply" else "applied"
    install.reset(start)
    steps = install.steps(op)
    for n in range(1, len(steps) + 2):
        install.reset(start)
        cp = tfo(op, *install.args, env={"TFO_FAULT_AT": str(n)})
        if n > len(steps):
            assert cp.returncode == 0, cp.stderr
            break
        assert cp.returncode == KILLED, (steps[n - 1], cp.stdout, cp.stderr)
        install.snapshot(f"killed-{n}")
        install.check_recoveries(f"killed-{n}", op)
    # the kill points tested (update when the journal's steps change)
    assert len(steps) == {"apply": 21, "revert": 14}[op], steps


@pytest.mark.parametrize("recover", ["revert", "apply"])
def test_recovery_killed_at_every_step(install, recover):
    """An apply killed just after its first patched file went in, then the
    recovering command killed at each of its own steps, then run again."""
    steps = install.steps("apply")
    n0 = next(i for i, s in enumerate(steps, 1) if s.startswith(f"{i} replace ") and "_guards.py" in s)
    assert tfo("apply", *install.args, env={"TFO_FAULT_AT": str(n0)}).returncode == KILLED
    install.snapshot("killed")
    want = install.applied if recover == "apply" else install.pristine
    m = 0
    while True:
        m += 1
        install.reset("killed")
        cp = tfo(recover, *install.args, env={"TFO_FAULT_AT": str(m)})
        if cp.returncode == 0:
            break
        assert cp.returncode == KILLED, cp.stderr
        if (install.sp / "torch" / st.JOURNAL_NAME).exists():
            assert "journal:       interrupted " in install.status()
        getattr(install, recover)()
        assert tree_digest(install.sp) == want, m
        assert_record_matches_files(install.sp)
    assert tree_digest(install.sp) == want
    # the kill points tested (update when the journal's steps change)
    assert m - 1 == {"revert": 9, "apply": 29}[recover]


@pytest.mark.parametrize("op", ["apply", "revert"])
def test_disk_full_at_every_step(install, op):
    """ENOSPC (injected) at each durable step: apply rolls back completely
    and says so; revert either changed nothing or says to rerun it."""
    start = "pristine" if op == "apply" else "applied"
    install.reset(start)
    n = 0
    while True:
        n += 1
        install.reset(start)
        cp = tfo(op, *install.args, env={"TFO_FAULT_AT": f"{n}:enospc"})
        if cp.returncode == 0:
            break
        assert cp.returncode == 2, cp.stderr
        assert cp.stderr.startswith("error: ") and "Traceback" not in cp.stderr, cp.stderr
        assert "No space left on device" in cp.stderr
        if op == "apply" or "nothing was changed" in cp.stderr:
            assert "nothing was changed" in cp.stderr
            assert tree_digest(install.sp) == (install.pristine if op == "apply" else install.applied), n
        else:
            assert "next: fix that, then rerun: python -m torch_fork_overlay revert" in cp.stderr
            install.revert()
            assert tree_digest(install.sp) == install.pristine
    assert n - 1 == {"apply": 20, "revert": 13}[op]  # the last step (unlock) cannot fail


def _kill_at(install: Install, op: str, step: str) -> None:
    steps = install.steps(op)
    n = next(i for i, s in enumerate(steps, 1) if s.split(" ", 1)[1].startswith(step))
    assert tfo(op, *install.args, env={"TFO_FAULT_AT": str(n)}).returncode == KILLED


def test_apply_killed_after_the_last_replace_before_the_state_file(install):
    _kill_at(install, "apply", f"write {install.sp}/torch/._fork_overlay_state.json")
    report = install.status()
    assert "journal:       interrupted apply: " in report
    assert report.endswith("files:\n  patched   torch/_dynamo/config.py\n  patched   torch/_guards.py")
    assert install.apply().startswith("rolled back the interrupted apply, then: applied 2 patch(es)")
    assert tree_digest(install.sp) == install.applied


def test_revert_after_an_interrupted_revert(install):
    install.reset("applied")
    _kill_at(install, "revert", f"unlink {install.sp}/torch/_fork_overlay_state.json")
    assert "journal:       interrupted revert: " in install.status()
    assert install.revert() == (f"rolled back the interrupted revert: torch 2.15.0+cu132 at "
                                f"{install.sp / 'torch'} is pristine (2 file(s) hash-checked)")
    assert tree_digest(install.sp) == install.pristine  # RECORD byte-identical, no temp file
    assert "nothing to revert" in install.revert()
