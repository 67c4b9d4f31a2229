"""Series parsing, and that the shipped patches/ series is consistent."""

from __future__ import annotations

import re
import shutil

import pytest

from conftest import REPO
from torch_fork_overlay import state as st
from torch_fork_overlay.apply import patch_tree
from torch_fork_overlay.errors import OverlayError
from torch_fork_overlay.series import load_series, supported_versions

SHIPPED = REPO / "patches"


def test_fixture_series_parsed(patches_dir):
    s = load_series("2.15.0+cu132", patches_dir=patches_dir)
    assert s.version == "2.15.0"
    assert [(p.name, p.files, p.is_test) for p in s.patches] == [
        ("0001-guards-Mark-detect_fake_mode.patch", ("torch/_guards.py",), False),
        ("0002-dynamo-Mark-config.patch", ("torch/_dynamo/config.py",), False),
        ("0003-test-Add-fixture-test.patch", ("test/dynamo/test_fixture.py",), True),
    ]
    assert s.patches[2].new_files == ("test/dynamo/test_fixture.py",)
    assert sorted(s.manifest) == ["torch/_dynamo/config.py", "torch/_guards.py"]


def test_series_comments_and_missing_patch(patches_dir):
    series = patches_dir / "v2.15.0/series"
    series.write_text("# comment\n\n" + series.read_text() + "0004-missing.patch  # trailing comment\n")
    with pytest.raises(OverlayError) as e:
        load_series("2.15.0", patches_dir=patches_dir)
    assert str(e.value) == (
        f"error: patch 0004-missing.patch listed in {series} does not exist\n"
        "  likely cause: the series file and the patch files are out of sync\n"
        f"  next: restore {series.parent / '0004-missing.patch'} (git checkout -- "
        f"{series.parent / '0004-missing.patch'}) or remove it from {series}"
    )


@pytest.mark.parametrize("bad", ["/etc/passwd", "torch/../../x.py", "../x.py"])
def test_escaping_paths_rejected(patches_dir, bad):
    p = patches_dir / "v2.15.0/0002-dynamo-Mark-config.patch"
    p.write_text(p.read_text().replace("+++ b/torch/_dynamo/config.py", f"+++ b/{bad}"))
    with pytest.raises(OverlayError, match="escapes the tree it applies to"):
        load_series("2.15.0", patches_dir=patches_dir)


def test_supported_versions_sorted(tmp_path):
    for v in ["2.9.0", "2.15.0", "2.13.0", "notaversion"]:
        (tmp_path / f"v{v}").mkdir()
        (tmp_path / f"v{v}" / "series").write_text("")
    (tmp_path / "v2.14.1").mkdir()  # no series file: not supported
    assert supported_versions(tmp_path) == ["2.9.0", "2.13.0", "2.15.0"]


# -- the shipped series -------------------------------------------------------

@pytest.mark.parametrize("version", supported_versions(SHIPPED))
def test_shipped_series_is_consistent(version, tmp_path, stock_site_packages):
    s = load_series(version, patches_dir=SHIPPED)
    listed = [p.name for p in s.patches]
    on_disk = sorted(p.name for p in s.dir.glob("*.patch"))
    assert sorted(listed) == on_disk, "every patch file is listed in series, and vice versa"
    for i, p in enumerate(s.patches, 1):
        assert re.fullmatch(rf"{i:04d}(-[a-z_]+)+-[A-Z][\w.-]+\.patch", p.name), p.name
        text = p.path.read_text()
        assert text.startswith("From 0000000000000000000000000000000000000000 "), "made with --zero-commit"
        for trailer in (f"Applies-To: torch {version}", "Forwarded: ", "Last-Update: "):
            assert f"\n{trailer}" in text, (p.name, trailer)
    if version != "2.15.0":
        pytest.skip("pristine files available for 2.15.0 only")
    root = tmp_path / "root"
    for rel, v in s.manifest.items():
        src = stock_site_packages / rel
        assert st.sha256_file(src) == v["pristine"], rel  # None: a file the series adds
        if v["pristine"] is not None:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, root / rel)
    assert patch_tree(root=root, series=s, include_tests=True) == listed
    for rel, v in s.manifest.items():
        assert st.sha256_file(root / rel) == v["patched"], rel
