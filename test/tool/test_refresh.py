"""refresh: patches regenerate without churn; new files become new-file diffs."""

from __future__ import annotations

import shutil

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
