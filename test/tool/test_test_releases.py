"""tools/test-releases: which releases it runs (--dry-run prints the plan), and
its loop (steps, skips, venv deletion, summary, exit status) with stand-in
steps instead of pip and torch."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

SCRIPT = REPO / "tools" / "test-releases"


def load_script():
    loader = importlib.machinery.SourceFileLoader("tfo_test_releases", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


tr = load_script()


def patches(tmp_path: Path, *releases: str) -> Path:
    """A patches folder with (empty) series folders: enough for the selection."""
    root = tmp_path / "patches"
    for r in releases:
        (root / f"v{r}").mkdir(parents=True)
        (root / f"v{r}" / "series").write_text("# synthetic\n")
    return root


def dry_run(tmp_path, root: Path, **env) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != tr.ENV_RELEASES}
    full.update({"TORCH_FORK_OVERLAY_PATCHES": str(root), "PYTHON": "/usr/bin/python3.11", **env})
    return subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, env=full, cwd=tmp_path)


def test_only_the_default_release_is_nothing_to_do(tmp_path):
    root = patches(tmp_path, "2.15.0")
    cp = dry_run(tmp_path, root)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == (f"tools/test-releases: nothing to do: {root} holds only the default release "
                         "2.15.0, which tools/test covers\n")
    assert not (tmp_path / "out").exists()


def test_every_folder_but_the_default_oldest_first(tmp_path):
    root = patches(tmp_path, "2.15.0", "2.13.0", "2.9.1", "2.10.0")
    (root / "v2.12.1").mkdir()  # a folder without a series file (say, only a README): not a release
    cp = dry_run(tmp_path, root)
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    assert lines[0] == ("tools/test-releases: 3 release(s), one at a time: 2.9.1, 2.10.0, 2.13.0 (every "
                        "folder of patches/ but the default release 2.15.0, which tools/test covers)")
    assert lines[1] == f"  2.9.1: series {root / 'v2.9.1'}"
    assert [l for l in lines if l.startswith("[")] == ["[2.9.1]", "[2.10.0]", "[2.13.0]"]
    out, vpy = tmp_path / "out", tmp_path / "out" / "venv-2.9.1" / "bin" / "python"
    # Inductor's caches start cold, in the venv deleted at the end
    cold = f"TORCHINDUCTOR_CACHE_DIR={out / 'venv-2.9.1' / 'torchinductor-cache'}"
    i = lines.index("[2.9.1]")
    assert lines[i + 1:i + 8] == [
        f"  1 venv     /usr/bin/python3.11 -m venv {out / 'venv-2.9.1'}",
        f"  2 install  PIP_CONSTRAINT={out / 'empty-constraints.txt'} {vpy} -m pip install -q torch==2.9.1 "
        "-r requirements-dev.txt",
        f"  3 stock    TORCH_FORK_OVERLAY_STOCK_PYTHON={vpy} {cold} {vpy} -m pytest -q -p no:cacheprovider -rfEs -o tmp_path_retention_policy=failed "
        f"--junitxml={out / '2.9.1' / 'stock.xml'} test/test_stock_shows_the_bug.py",
        f"  4 apply    {sys.executable} -m torch_fork_overlay apply --python {vpy}",
        f"  5 patched  TORCH_FORK_OVERLAY_PATCHED_PYTHON={vpy} {cold} {vpy} -m pytest -q -p no:cacheprovider -rfEs -o tmp_path_retention_policy=failed "
        f"--junitxml={out / '2.9.1' / 'patched.xml'} test/test_stock_shows_the_bug.py",
        f"  6 contract {cold} TORCH_FORK_OVERLAY_REPLAY_EXAMPLES=100 {vpy} -m pytest -q -p no:cacheprovider -rfEs -o tmp_path_retention_policy=failed -n 2 --junitxml={out / '2.9.1' / 'contract.xml'} "
        "test/dynamo/test_compile_under_fake_mode.py test/dynamo/test_compile_under_fake_mode_guards.py "
        "test/dynamo/test_compile_under_fake_mode_backends.py test/dynamo/test_compile_under_fake_mode_fidelity.py "
        "test/dynamo/test_compile_under_fake_mode_replay.py "
        "test/dynamo/test_compile_under_fake_mode_trackers.py "
        "test/dynamo/test_compile_under_fake_mode_memory_estimation.py "
        "test/dynamo/test_compile_under_fake_mode_optimizer.py test/dynamo/test_compile_under_fake_mode_regions.py "
        "test/dynamo/test_compile_under_fake_mode_inductor_buffers.py",
        f"  7 cleanup  rm -rf {out / 'venv-2.9.1'}",
    ]
    # PIP_CONSTRAINT is set for the install step only (one line per release)
    assert [l.split()[1] for l in lines if "PIP_CONSTRAINT" in l] == ["install"] * 3
    assert lines[-1] == f"(dry run: nothing was run; the summary would go to {out / 'summary.md'})"
    assert not out.exists()


def test_env_var_limits_the_releases(tmp_path):
    root = patches(tmp_path, "2.15.0", "2.13.0", "2.9.1")
    cp = dry_run(tmp_path, root, TORCH_FORK_OVERLAY_RELEASES=" 2.13.0, 2.9.0  2.13.0 2.15.0", PYTEST_JOBS="4",
                 TORCH_FORK_OVERLAY_RELEASES_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu")
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    assert lines[:4] == [
        "tools/test-releases: 3 release(s), one at a time: 2.13.0, 2.9.0, 2.15.0 ($TORCH_FORK_OVERLAY_RELEASES)",
        f"  2.13.0: series {root / 'v2.13.0'}",
        "  2.9.0: no folder of its own: apply looks for the series with its bytes, else refuses",
        f"  2.15.0: series {root / 'v2.15.0'}",
    ]
    assert sum(" -n 4 " in l for l in lines) == 3
    assert [l for l in lines if " install " in l][0].endswith(
        " -m pip install -q torch==2.13.0 -r requirements-dev.txt --index-url https://download.pytorch.org/whl/cpu")


def test_bad_release_in_env_var(tmp_path):
    root = patches(tmp_path, "2.15.0", "2.9.1")
    cp = dry_run(tmp_path, root, TORCH_FORK_OVERLAY_RELEASES="2.9.1 2.l3")
    assert cp.returncode == 2 and cp.stdout == ""
    assert cp.stderr == (
        "error: $TORCH_FORK_OVERLAY_RELEASES holds '2.l3', which is not a torch release\n"
        "  likely cause: a typo; releases are separated by spaces or commas\n"
        '  next: TORCH_FORK_OVERLAY_RELEASES="2.9.1 2.15.0" tools/test-releases (supported: 2.9.1, 2.15.0)\n'
    )


def test_empty_env_var_means_the_default_selection():
    assert tr.select_releases("  ", ["2.9.1", "2.15.0"], "2.15.0") == (
        ["2.9.1"], "every folder of patches/ but the default release 2.15.0, which tools/test covers")
    assert tr.select_releases(None, ["2.9.1"], None)[0] == ["2.9.1"]


# -- the loop, with stand-in steps --------------------------------------------------

JUNIT = ('<testsuites><testsuite name="pytest" tests="{t}" failures="{f}" errors="0" skipped="{s}">'
         '</testsuite></testsuites>')


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """plan() returns python -c steps; ``fail`` names (release, step) pairs that exit 1."""
    fail: set[tuple[str, str]] = set()
    ran: list[tuple[str, str]] = []

    def plan(release, *, out, python, jobs):
        steps = []
        for name in ("venv", "install", "stock", "apply", "patched", "contract"):
            code = ["import os, sys"]
            if name == "venv":
                code.append(f"os.makedirs({str(out / f'venv-{release}')!r})")
            if name in ("stock", "patched", "contract"):
                xml = JUNIT.format(t=10, f=1 if (release, name) in fail else 0, s=2)
                code.append(f"open({str(out / release / f'{name}.xml')!r}, 'w').write({xml!r})")
            code.append(f"print('step {name} of {release}'); sys.exit({int((release, name) in fail)})")
            steps.append((name, [sys.executable, "-c", "; ".join(code)], {}))
        ran.extend((release, n) for n, _, _ in steps)
        return steps

    monkeypatch.setattr(tr, "plan", plan)
    # the stand-in steps install nothing: the disk guard must not depend on
    # how full this machine's disk is (test_install_refused_... sets its own)
    monkeypatch.setenv(tr.MIN_FREE_ENV, "0")
    monkeypatch.setenv("TORCH_FORK_OVERLAY_PATCHES", str(patches(tmp_path, "2.9.1", "2.13.0", "2.15.0")))
    monkeypatch.delenv(tr.ENV_RELEASES, raising=False)
    return fail


def test_loop_all_pass(tmp_path, stand_in, capsys):
    out = tmp_path / "out"
    (out / "venv-2.8.0").mkdir(parents=True)  # left by a killed run
    assert tr.main(["--out-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"removing {out / 'venv-2.8.0'}: left by an earlier run" in printed
    assert "==> [2.9.1] venv: " in printed and "    [2.9.1] contract: 0s, ok; 8 passed, 0 failed, 2 skipped" in printed
    assert printed.splitlines()[-1].startswith("tools/test-releases: 2 release(s) passed in 0:0")
    assert sorted(p.name for p in out.iterdir()) == ["2.13.0", "2.9.1", "empty-constraints.txt",
                                                     "summary.json", "summary.md"]  # no venv left
    assert (out / "empty-constraints.txt").read_text() == ""
    data = json.loads((out / "summary.json").read_text())
    assert [(r["release"], r["ok"], r["result"]) for r in data["releases"]] == [
        ("2.9.1", True, "pass: 8 passed, 0 failed, 2 skipped"), ("2.13.0", True, "pass: 8 passed, 0 failed, 2 skipped")]
    assert data["default"] == "2.15.0"
    md = (out / "summary.md").read_text().splitlines()
    assert md[2] == "| release | installed | series | stock seed | apply | patched seed | contract tests | time | result |"
    assert md[4].startswith("| 2.9.1 | - | - | pass (0s) | pass (0s) | pass (0s) | pass (0s): 8 passed, 0 failed, 2 skipped | 0:0")


def test_loop_names_the_failed_release_and_goes_on(tmp_path, stand_in, capsys):
    stand_in.add(("2.9.1", "install"))
    stand_in.add(("2.13.0", "stock"))
    out = tmp_path / "out"
    assert tr.main(["--out-dir", str(out)]) == 1
    cap = capsys.readouterr()
    # install failed: nothing that needs it ran; the venv was deleted all the same
    for step in ("stock", "apply", "patched", "contract"):
        assert f"    [2.9.1] {step}: skipped (" in cap.out
    assert f"    [2.9.1] deleted {out / 'venv-2.9.1'}: " in cap.out
    assert "step install of 2.9.1" in cap.out and f"full log: {out / '2.9.1' / 'install.log'}" in cap.out
    # a stock failure does not stop the patched steps
    assert "    [2.13.0] contract: 0s, ok" in cap.out
    assert cap.err == (
        "error: torch 2.9.1, 2.13.0 failed in tools/test-releases (2.9.1: install, stock, apply, patched, "
        "contract; 2.13.0: stock)\n"
        f"  next: read the logs in {out}/<release>/, or rerun one: TORCH_FORK_OVERLAY_RELEASES=2.9.1 "
        "tools/test-releases\n")
    assert not list(out.glob("venv-*"))
    rows = {r["release"]: r for r in json.loads((out / "summary.json").read_text())["releases"]}
    assert rows["2.9.1"]["result"] == "FAIL: install, stock, apply, patched, contract"
    assert rows["2.9.1"]["steps"]["apply"] == {"ok": False, "skipped": True, "seconds": 0}
    assert rows["2.13.0"]["result"] == "FAIL: stock: 8 passed, 0 failed, 2 skipped"


def test_install_refused_when_the_disk_is_short(tmp_path, stand_in, capsys, monkeypatch):
    monkeypatch.setenv(tr.MIN_FREE_ENV, "8")
    monkeypatch.setattr(tr.shutil, "disk_usage", lambda path: tr.shutil._ntuple_diskusage(100 * 2**30, 97 * 2**30, 3 * 2**30))
    out = tmp_path / "out"
    assert tr.main(["--out-dir", str(out)]) == 1
    cap = capsys.readouterr()
    assert (out / "2.9.1" / "install.log").read_text().startswith("error: only 3.0 GB free")  # pip never started
    assert f"      error: only 3.0 GB free in {out}; installing one torch release with its nvidia dependencies " \
           "needs about 8 GB ($TORCH_FORK_OVERLAY_RELEASES_MIN_FREE_GB)" in cap.out
    rows = {r["release"]: r for r in json.loads((out / "summary.json").read_text())["releases"]}
    assert rows["2.9.1"]["result"] == rows["2.13.0"]["result"] == "FAIL: install, stock, apply, patched, contract"
    monkeypatch.setenv(tr.MIN_FREE_ENV, "2.5")  # enough: everything runs
    assert tr.main(["--out-dir", str(out)]) == 0


def test_junit_counts(tmp_path):
    p = tmp_path / "j.xml"
    p.write_text('<testsuite tests="5" failures="1" errors="1" skipped="1"/>')
    assert tr.junit_counts(p) == {"passed": 2, "failed": 1, "errors": 1, "skipped": 1}
    assert tr.junit_counts(tmp_path / "missing.xml") is None
