"""refresh: patches regenerate without churn; new files become new-file diffs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from torch_fork_overlay import refresh
from torch_fork_overlay.apply import patch_tree
from torch_fork_overlay.errors import OverlayError
from torch_fork_overlay.series import load_series


def _digest(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_regenerate_unchanged_patch_is_byte_identical(tmp_path, patches_dir, stock_site_packages):
    s = load_series("2.15.0", patches_dir=patches_dir)
    tree = tmp_path / "tree"
    shutil.copytree(stock_site_packages / "torch/_dynamo", tree / "torch/_dynamo",
                    ignore=lambda d, names: [n for n in names if n != "config.py"])
    shutil.copyfile(stock_site_packages / "torch/_guards.py", tree / "torch/_guards.py")
    patch_tree(root=tree, series=s, include_tests=True)
    before = _digest(s.dir)
    pristine = refresh.Pristine(tree=stock_site_packages)
    for p in s.patches:
        refresh.regenerate_patch(version="2.15.0", pristine=pristine, tree=tree, patch=p.name,
                                 patches_dir=patches_dir)
    assert _digest(s.dir) == before


def test_regenerate_changed_patch_keeps_message_and_updates_manifest(tmp_path, patches_dir,
                                                                     stock_site_packages):
    s = load_series("2.15.0", patches_dir=patches_dir)
    tree = tmp_path / "tree"
    (tree / "torch").mkdir(parents=True)
    guards = tree / "torch/_guards.py"
    shutil.copyfile(stock_site_packages / "torch/_guards.py", guards)
    patch_tree(root=tree, series=refresh._sub_series(s, [s.patches[0].name]), include_tests=True)
    guards.write_text(guards.read_text() + "# second line\n")
    old_manifest = (s.dir / "manifest.json").read_text()
    p = refresh.regenerate_patch(version="2.15.0", pristine=refresh.Pristine(tree=stock_site_packages),
                                 tree=tree, patch=s.patches[0].name, patches_dir=patches_dir)
    text = p.read_text()
    assert "Subject: [PATCH] guards: Mark detect_fake_mode\n\nFixture patch 1 for the tool's tests." in text
    assert "+# second line" in text
    assert (s.dir / "manifest.json").read_text() != old_manifest
    load_series("2.15.0", patches_dir=patches_dir)  # manifest consistent again


def test_new_test_file_becomes_new_file_diff_and_applies_to_checkout(tmp_path, patches_dir,
                                                                    stock_site_packages):
    s = load_series("2.15.0", patches_dir=patches_dir)
    text = s.patches[2].path.read_text()
    assert "new file mode 100644\n" in text and "--- /dev/null\n+++ b/test/dynamo/test_fixture.py" in text
    checkout = tmp_path / "checkout"  # laid out like a PyTorch checkout
    for rel in s.manifest:
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(stock_site_packages / rel, checkout / rel)
    assert len(patch_tree(root=checkout, series=s, include_tests=True)) == 3
    assert (checkout / "test/dynamo/test_fixture.py").read_text() == '# Owner(s): ["module: dynamo"]\n'


def test_refresh_refuses_tree_without_edits(tmp_path, patches_dir, stock_site_packages):
    msg = tmp_path / "msg"
    msg.write_text("guards: Nothing\n")
    before = _digest(patches_dir / "v2.15.0")
    with pytest.raises(OverlayError, match=r"torch/version.py in .* identical to pristine \+ earlier patches"):
        refresh.new_patch(version="2.15.0", pristine=refresh.Pristine(tree=stock_site_packages),
                          tree=stock_site_packages, files=["torch/version.py"], message_file=msg,
                          patches_dir=patches_dir)
    assert _digest(patches_dir / "v2.15.0") == before


def test_replace_takes_the_old_patch_position(tmp_path, patches_dir, stock_site_packages):
    tree = tmp_path / "tree"
    (tree / "torch").mkdir(parents=True)
    g = tree / "torch/_guards.py"
    g.write_text((stock_site_packages / "torch/_guards.py").read_text() + "# real fix\n")
    msg = tmp_path / "msg"
    msg.write_text("guards: Inherit the ambient FakeTensorMode\n\nBody.\n")
    refresh.new_patch(version="2.15.0", pristine=refresh.Pristine(tree=stock_site_packages), tree=tree,
                      files=["torch/_guards.py"], message_file=msg,
                      replace="0001-guards-Mark-detect_fake_mode.patch", patches_dir=patches_dir)
    s = load_series("2.15.0", patches_dir=patches_dir)
    assert [p.name for p in s.patches] == [
        "0001-guards-Inherit-the-ambient-FakeTensorMode.patch",
        "0002-dynamo-Mark-config.patch",
        "0003-test-Add-fixture-test.patch",
    ]
    assert not (s.dir / "0001-guards-Mark-detect_fake_mode.patch").exists()


# -- nothing in patches/ changes unless the whole new series is good (synthetic, no torch) --

from conftest import make_synthetic_install, run_cli  # noqa: E402


def _synthetic(tmp_path, synth):
    sp, pdir = synth
    pristine_sp = make_synthetic_install(tmp_path / "pristine")
    return sp, pdir, pristine_sp


def _refresh(pdir, pristine_sp, *args):
    return run_cli("refresh", "--version", "2.15.0", "--pristine", str(pristine_sp),
                   "--patches-dir", str(pdir), *args)


def test_refresh_with_a_tree_missing_files_changes_nothing(tmp_path, synth):
    sp, pdir, pristine_sp = _synthetic(tmp_path, synth)
    tree = tmp_path / "tree"
    (tree / "torch").mkdir(parents=True)  # torch/_guards.py is missing
    before = _digest(pdir / "v2.15.0")
    cp = _refresh(pdir, pristine_sp, "--tree", str(tree), "--patch", "0001-area-Synthetic-patch-1.patch")
    assert cp.returncode == 2, cp.stderr
    assert cp.stderr.startswith(
        f"error: --tree {tree} has no torch/_guards.py, which 0001-area-Synthetic-patch-1.patch "
        "touches; nothing in patches/ was changed\n")
    assert _digest(pdir / "v2.15.0") == before
    assert sorted(p.name for p in pdir.iterdir()) == ["v2.15.0"]  # no lock file left
    assert run_cli("apply", "--site-packages", str(sp), "--patches-dir", str(pdir)).returncode == 0


def test_refresh_with_an_unedited_tree_changes_nothing(tmp_path, synth):
    sp, pdir, pristine_sp = _synthetic(tmp_path, synth)
    before = _digest(pdir / "v2.15.0")
    cp = _refresh(pdir, pristine_sp, "--tree", str(pristine_sp), "--patch", "0001-area-Synthetic-patch-1.patch")
    assert cp.returncode == 2, cp.stderr
    assert cp.stderr.startswith(
        f"error: torch/_guards.py in {pristine_sp} are identical to pristine + earlier patches; "
        "nothing in patches/ was changed\n")
    assert _digest(pdir / "v2.15.0") == before
    load_series("2.15.0", patches_dir=pdir)


def test_refresh_that_breaks_a_later_patch_changes_nothing(tmp_path, synth):
    """0001 regenerated from a tree whose edit conflicts with nothing, but the
    series file lists a patch that no longer applies after it: refused."""
    sp, pdir, pristine_sp = _synthetic(tmp_path, synth)
    s = load_series("2.15.0", patches_dir=pdir)
    tree = tmp_path / "tree"
    (tree / "torch/_dynamo").mkdir(parents=True)
    cfg = (pristine_sp / "torch/_dynamo/config.py").read_text()
    # 0002 adds a line after "import sys"; a new 0001 that rewrites that line breaks 0002
    (tree / "torch/_dynamo/config.py").write_text(cfg.replace("import sys\n", "import sys as _sys\n"))
    msg = tmp_path / "msg"
    msg.write_text("area: Rename sys\n")
    before = _digest(s.dir)
    cp = _refresh(pdir, pristine_sp, "--tree", str(tree), "--files", "torch/_dynamo/config.py",
                  "--message", str(msg), "--replace", "0001-area-Synthetic-patch-1.patch")
    assert cp.returncode == 2, cp.stderr
    assert "0002-area-Synthetic-patch-2.patch" in cp.stderr and "does not apply" in cp.stderr
    assert _digest(s.dir) == before


def test_refresh_waits_for_another_refresh(tmp_path, synth):
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO

    sp, pdir, pristine_sp = _synthetic(tmp_path, synth)
    tree = tmp_path / "tree"
    (tree / "torch").mkdir(parents=True)
    g = (pristine_sp / "torch/_guards.py").read_text()
    (tree / "torch/_guards.py").write_text(g.replace("def guard_7(x):\n", "def guard_7(x):\n    # v2\n"))
    args = ["--version", "2.15.0", "--pristine", str(pristine_sp), "--patches-dir", str(pdir),
            "--tree", str(tree), "--patch", "0001-area-Synthetic-patch-1.patch"]
    cmd = [sys.executable, "-m", "torch_fork_overlay", "refresh", *args]
    first = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "TFO_FAULT_AT": "1:stop"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stat = Path(f"/proc/{first.pid}/stat")
    deadline = time.monotonic() + 30
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.02)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TFO_FAULT")}
        second = subprocess.run(cmd, cwd=REPO, env={**env, "TORCH_FORK_OVERLAY_LOCK_TIMEOUT": "0.3"},
                                capture_output=True, text=True)
        assert second.returncode == 2
        assert "waiting up to 0.3s for " in second.stdout
        assert second.stderr.startswith(f"error: another torch_fork_overlay run has held {pdir}/")
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert "+    # v2" in (pdir / "v2.15.0/0001-area-Synthetic-patch-1.patch").read_text()
    assert sorted(p.name for p in pdir.iterdir()) == ["v2.15.0"]
