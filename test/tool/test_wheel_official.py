"""The patched wheel built from the real official torch 2.15.0 wheel installs
with plain pip into a fresh venv and reports the label.  Slow (~1-2 min):
one build per session, or the wheel tools/bootstrap already built
($TORCH_FORK_OVERLAY_PATCHED_WHEEL) when its patched files match the shipped
manifest."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from wheel.wheelfile import WheelFile

from conftest import REPO
from torch_fork_overlay import state as st
from torch_fork_overlay.series import load_series
from torch_fork_overlay.wheel import build_wheel

LABELLED = "2.15.0+cu132.fakemode.1"


def _official_wheel() -> Path:
    env = os.environ.get("TORCH_FORK_OVERLAY_WHEEL")
    if env:
        return Path(env)
    found = sorted((REPO / ".cache" / "wheels").glob("torch-2.15.0-cp311-*.whl"))
    if not found:
        pytest.skip("no official torch 2.15.0 wheel: run tools/bootstrap or set TORCH_FORK_OVERLAY_WHEEL")
    return found[-1]


def _up_to_date(whl: Path) -> bool:
    manifest = load_series("2.15.0", patches_dir=REPO / "patches").manifest
    with WheelFile(str(whl)) as wf:
        return all(st.sha256_bytes(wf.read(rel)) == v["patched"] for rel, v in manifest.items())


@pytest.fixture(scope="session")
def patched_wheel(tmp_path_factory) -> Path:
    prebuilt = os.environ.get("TORCH_FORK_OVERLAY_PATCHED_WHEEL")
    if prebuilt and Path(prebuilt).is_file() and _up_to_date(Path(prebuilt)):
        return Path(prebuilt)
    return build_wheel(wheel_path=_official_wheel(), out_dir=tmp_path_factory.mktemp("dist"),
                       patches_dir=REPO / "patches")


def test_official_wheel_installs_into_fresh_venv_and_reports_label(tmp_path, patched_wheel):
    assert patched_wheel.name == f"torch-{LABELLED}-cp311-cp311-manylinux_2_28_x86_64.whl"
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    empty = tmp_path / "no-constraints.txt"
    empty.write_text("")
    # --no-deps: the CUDA runtime wheels are 3 GB and irrelevant to packaging;
    # PIP_CONSTRAINT: a site pip.conf may cap torch<=2.14.1 (see tools/bootstrap).
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
         "--no-index", str(patched_wheel)],
        check=True, env={**os.environ, "PIP_CONSTRAINT": str(empty)},
    )
    out = subprocess.run(
        [str(py), "-c", "import importlib.metadata as m, importlib.util as u; "
         "print(m.version('torch')); print(u.find_spec('torch').origin)"],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    assert out[0] == LABELLED
    torch_dir = Path(out[1]).parent
    assert torch_dir.is_relative_to(env_dir)
    assert f"__version__ = '{LABELLED}'" in (torch_dir / "version.py").read_text()
    # pip check of RECORD: every installed file is listed with its hash
    record = next(torch_dir.parent.glob("torch-*.dist-info")) / "RECORD"
    guards = (torch_dir / "_guards.py").read_bytes()
    assert st.record_line("torch/_guards.py", guards) in record.read_text()

    stock = os.environ.get("TORCH_FORK_OVERLAY_STOCK_PYTHON")
    if not stock:
        return
    # Import it for real. Its CUDA runtime libraries come from the stock venv,
    # appended to sys.path by a .pth, so our torch (earlier on sys.path) wins
    # and torch's loader finds nvidia/* there instead of a 3 GB reinstall.
    stock_sp = subprocess.run(
        [stock, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip()
    (torch_dir.parent / "zz_stock_deps.pth").write_text(stock_sp + "\n")
    out = subprocess.run(
        [str(py), "-c", "import torch; print(torch.__version__); print(torch.__file__)"],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    assert out[0] == LABELLED
    assert Path(out[1]).parent == torch_dir
