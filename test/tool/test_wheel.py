"""wheel: repack with the series applied, on small wheels made of real torch
files (fast); the official wheel is exercised in test_wheel_official.py."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from wheel.wheelfile import WheelFile

from conftest import FAKE_FILES, tree_digest
from torch_fork_overlay import state as st
from torch_fork_overlay.errors import OverlayError
from torch_fork_overlay.series import load_series
from torch_fork_overlay.wheel import build_wheel

TAGS = "cp311-cp311-manylinux_2_28_x86_64"


def make_wheel(dest: Path, stock: Path, *, name="torch", version="2.15.0", local_in_version_py="cu132",
               edit=None) -> Path:
    """A small but valid wheel (RECORD written by wheel's WheelFile) holding
    real torch files and the real METADATA/WHEEL."""
    (di,) = stock.glob("torch-*.dist-info")
    path = dest / f"{name}-{version}-{TAGS}.whl"
    dist_info = f"{name}-{version}.dist-info"
    with WheelFile(str(path), "w") as wf:
        for rel in FAKE_FILES:
            data = (stock / rel).read_bytes()
            if rel == "torch/version.py":
                data = data.replace(b"2.15.0+cu132", f"2.15.0+{local_in_version_py}".encode())
            if edit and rel in edit:
                data = edit[rel](data)
            wf.writestr(rel, data)
        meta = (di / "METADATA").read_bytes().replace(b"Version: 2.15.0\n", f"Version: {version}\n".encode(), 1)
        wf.writestr(f"{dist_info}/METADATA", meta)
        wf.writestr(f"{dist_info}/WHEEL", (di / "WHEEL").read_bytes())
    return path


def read_wheel(path: Path) -> dict[str, bytes]:
    with WheelFile(str(path)) as wf:  # verifies every member against RECORD
        return {n: wf.read(n) for n in wf.namelist() if not n.endswith("/RECORD")}


def test_label_appended_to_existing_local_version(tmp_path, stock_site_packages, patches_dir):
    whl = make_wheel(tmp_path, stock_site_packages)
    out = tmp_path / "dist"
    built = build_wheel(wheel_path=whl, out_dir=out, patches_dir=patches_dir)
    assert built == out / f"torch-2.15.0+cu132.fakemode.1-{TAGS}.whl"
    assert sorted(p.name for p in out.iterdir()) == [built.name]  # no temp dirs left behind
    files = read_wheel(built)
    di = "torch-2.15.0+cu132.fakemode.1.dist-info"
    assert f"{di}/METADATA" in files
    assert b"\nVersion: 2.15.0+cu132.fakemode.1\n" in files[f"{di}/METADATA"]
    assert b"__version__ = '2.15.0+cu132.fakemode.1'\n" in files["torch/version.py"]
    manifest = load_series("2.15.0", patches_dir=patches_dir).manifest
    for rel, v in manifest.items():
        assert st.sha256_bytes(files[rel]) == v["patched"], rel
    assert not any(n.startswith("test/") for n in files)


def test_label_with_metadata_local_version(tmp_path, stock_site_packages, patches_dir):
    whl = make_wheel(tmp_path, stock_site_packages, version="2.15.0+cpu", local_in_version_py="cpu")
    built = build_wheel(wheel_path=whl, out_dir=tmp_path / "dist", patches_dir=patches_dir, label="x.2")
    assert built.name == f"torch-2.15.0+cpu.x.2-{TAGS}.whl"
    assert b"__version__ = '2.15.0+cpu.x.2'\n" in read_wheel(built)["torch/version.py"]


def _fails(tmp_path, whl, patches_dir) -> str:
    out = tmp_path / "dist"
    out.mkdir(exist_ok=True)
    before = tree_digest(tmp_path)
    with pytest.raises(OverlayError) as e:
        build_wheel(wheel_path=whl, out_dir=out, patches_dir=patches_dir)
    assert tree_digest(tmp_path) == before
    return str(e.value)


# a file the user named is never to be deleted or overwritten: say how to pass the right one
NEXT = ("  next: pass an official torch wheel instead: --wheel /path/to/torch-2.15.0-<tags>.whl, or let "
        "the tool download it: python -m torch_fork_overlay wheel --version 2.15.0")


def test_truncated_wheel(tmp_path, stock_site_packages, patches_dir):
    whl = make_wheel(tmp_path, stock_site_packages)
    whl.write_bytes(whl.read_bytes()[:1000])
    assert _fails(tmp_path, whl, patches_dir) == (
        f"error: {whl} is not a usable official torch wheel: it is not a zip archive\n"
        "  likely cause: the download was truncated or the file is corrupt\n" + NEXT
    )


def test_wheel_with_file_not_matching_record(tmp_path, stock_site_packages, patches_dir):
    src = make_wheel(tmp_path, stock_site_packages)
    bad = tmp_path / "bad" / src.name
    bad.parent.mkdir()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == "torch/_guards.py":
                data = data.replace(b"TracingContext", b"TracingContexT", 1)
            zout.writestr(info, data)
    src.unlink()
    msg = _fails(tmp_path, bad, patches_dir)
    assert msg.startswith(f"error: wheel unpack failed on {bad}\n")
    assert "torch/_guards.py" in msg
    assert msg.endswith(
        "  likely cause: the wheel is corrupt: a file does not match its RECORD hash, or the archive "
        "is damaged\n"
    + NEXT)


def test_a_file_that_is_not_a_wheel_is_left_alone(tmp_path, patches_dir):
    """``wheel --wheel /etc/passwd``: a wrong path, not a file to delete."""
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    msg = _fails(tmp_path, passwd, patches_dir)
    assert msg.startswith(f"error: {passwd} is not a usable official torch wheel: bad file name (")
    assert "\n  likely cause: it is not a wheel file: a wrong path was passed\n" in msg
    assert msg.endswith("\n" + NEXT)
    assert "delete" not in msg and passwd.read_text().startswith("root:")


def test_own_download_that_is_corrupt_is_named_as_the_tools_own(tmp_path, stock_site_packages, patches_dir,
                                                               monkeypatch):
    """Only a wheel the tool downloaded into its cache may be removed, and the error says it is its own."""
    cached = make_wheel(tmp_path, stock_site_packages)
    cached.write_bytes(cached.read_bytes()[:1000])
    monkeypatch.setattr("torch_fork_overlay.wheel.download_wheel", lambda **kw: cached)
    with pytest.raises(OverlayError) as e:
        build_wheel(version="2.15.0", out_dir=tmp_path / "dist", patches_dir=patches_dir,
                    cache_dir=tmp_path / "cache")
    assert str(e.value).endswith(
        "  likely cause: the download was truncated or the file is corrupt\n"
        f"  next: it is this tool's own download (its cache): remove it, rm {cached}, and rerun: "
        "python -m torch_fork_overlay wheel --version 2.15.0")


def test_wheel_of_another_project(tmp_path, stock_site_packages, patches_dir):
    whl = make_wheel(tmp_path, stock_site_packages, name="numpy")
    assert _fails(tmp_path, whl, patches_dir) == (
        f"error: {whl} is not a usable official torch wheel: it is a wheel of 'numpy', not torch\n"
        "  likely cause: the wrong file was passed\n" + NEXT
    )


def test_torch_wheel_that_is_not_the_official_build(tmp_path, stock_site_packages, patches_dir):
    whl = make_wheel(tmp_path, stock_site_packages,
                     edit={"torch/_guards.py": lambda b: b + b"# rebuilt by someone\n"})
    assert _fails(tmp_path, whl, patches_dir) == (
        f"error: {whl} is not a usable official torch wheel: torch/_guards.py differ from pristine "
        "torch 2.15.0\n"
        "  likely cause: it is not an official build of that release (or was already patched)\n" + NEXT
    )


def test_torch_wheel_of_unsupported_release(tmp_path, stock_site_packages, patches_dir):
    whl = make_wheel(tmp_path, stock_site_packages, version="2.16.0",
                     edit={"torch/_guards.py": lambda b: b + b"# as 2.16.0 has it\n"})
    msg = _fails(tmp_path, whl, patches_dir)
    assert msg.startswith(f"error: no patch series for torch 2.16.0 ({whl}) in {patches_dir}: no folder "
                          "v2.16.0/, and no series' manifest matches its files")
    assert "\n  likely cause: torch 2.16.0 is not a supported release: this project supports torch 2.15.0;" in msg


def test_wheel_of_sibling_release_served_by_hashes(tmp_path, stock_site_packages, patches_dir, capsys):
    """2.15.1 without a folder: its touched files are 2.15.0's bytes, so v2.15.0 serves it."""
    whl = make_wheel(tmp_path, stock_site_packages, version="2.15.1", local_in_version_py="cu132")
    built = build_wheel(wheel_path=whl, out_dir=tmp_path / "dist", patches_dir=patches_dir)
    assert built.name == f"torch-2.15.1+cu132.fakemode.1-{TAGS}.whl"
    assert "torch 2.15.1: served by series v2.15.0: touched files identical (no folder v2.15.1)" in capsys.readouterr().out
    manifest = load_series("2.15.0", patches_dir=patches_dir).manifest
    files = read_wheel(built)
    assert all(st.sha256_bytes(files[rel]) == v["patched"] for rel, v in manifest.items())
