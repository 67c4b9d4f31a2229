"""CMake superbuild + ``source-build`` up to PyTorch's build command.

A real ``cmake`` configure/build runs on a tmp fake checkout holding the
shipped series' files from the official wheel, a ``version.txt`` and a tiny
setuptools ``setup.py`` standing in for PyTorch's (a real PyTorch build takes
hours; docs/source-build.md says what it needs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from _checkout_helpers import REPO, make_checkout  # noqa: E402

from torch_fork_overlay import source_build as sb  # noqa: E402
from torch_fork_overlay.errors import OverlayError  # noqa: E402
from torch_fork_overlay.series import load_series, supported_versions  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")

SERIES = load_series("2.15.0")

FAKE_SETUP = """\
import os
from setuptools import setup
assert os.environ["USE_CUDA"] == "0", os.environ["USE_CUDA"]
setup(name="torch", version=os.environ["PYTORCH_BUILD_VERSION"], py_modules=[])
"""


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    src = make_checkout(tmp_path_factory.mktemp("sb") / "pytorch", only=sorted(SERIES.manifest), tag=None)
    (src / "setup.py").write_text(FAKE_SETUP)
    (src / "requirements-build.txt").write_text("# PyTorch's lists more\nsetuptools>=60\n")
    return src


@pytest.fixture
def src(pristine, tmp_path):
    dest = tmp_path / "pytorch"
    shutil.copytree(pristine, dest, symlinks=True)
    return dest


def digest(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.parts}


def state(src: Path) -> set[str]:
    return set(sb.co.manifest_states(src, SERIES).values())


def cmake(*args, env=None, cwd=None):
    return subprocess.run(["cmake", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})})


def flat(text: str) -> str:
    """CMake wraps message(FATAL_ERROR) lines; compare with whitespace collapsed."""
    return " ".join(text.split())


# The first file the series changes that pristine torch has (the series also adds new files).
TOUCHED_PRISTINE_FILE = next(rel for rel, v in sorted(SERIES.manifest.items()) if v["pristine"])


def configure(build: Path, *defs: str, env=None):
    return cmake("-S", str(REPO), "-B", str(build), "-G", "Unix Makefiles",
                 f"-DPython3_EXECUTABLE={sys.executable}", *defs, env=env)


def test_configure_apply_and_dry_run(src, tmp_path):
    b = tmp_path / "build"
    cp = configure(b, f"-DPYTORCH_SOURCE_DIR={src}", "-DMAX_JOBS=3")
    assert cp.returncode == 0, cp.stderr
    assert f"{src} is torch 2.15.0 (pristine); series v2.15.0" in cp.stdout
    assert state(src) == {"pristine"}  # configure changes nothing
    cp = cmake("--build", str(b), "--target", "torch_wheel", env={"TORCH_FORK_OVERLAY_DRY_RUN": "1"})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    out = cp.stdout
    assert state(src) == {"patched"}
    assert "applied 0001-" in out and f"undo with: git -C {src} checkout -- {TOUCHED_PRISTINE_FILE}" in out
    assert f"  {sys.executable} -m pip wheel . --no-build-isolation --no-deps -v -w {b / 'dist'}" in out
    for line in ("PYTORCH_BUILD_VERSION=2.15.0+fakemode.1", "PYTORCH_BUILD_NUMBER=1", "USE_CUDA=0",
                 "MAX_JOBS=3", f"cwd: {src}"):
        assert line in out, line
    assert not (b / "dist").exists()  # nothing was built
    # idempotent: a second run sees the patched checkout and leaves it alone
    cp = cmake("--build", str(b), "--target", "torch_wheel", env={"TORCH_FORK_OVERLAY_DRY_RUN": "1"})
    assert cp.returncode == 0 and "already applied" in cp.stdout


def test_configure_rejects_another_release(src, tmp_path):
    # A release no folder of patches/ is for (every supported one has a folder now).
    (src / "version.txt").write_text("2.7.1a0\n")
    rel = TOUCHED_PRISTINE_FILE
    with open(src / rel, "a") as f:
        f.write("# as 2.7.1 has it\n")
    before = digest(src)
    cp = configure(tmp_path / "build", f"-DPYTORCH_SOURCE_DIR={src}")
    assert cp.returncode != 0
    assert (f"error: no patch series for {src}, torch 2.7.1a0 (version.txt) in {REPO / 'patches'}: "
            "no folder v2.7.1/, and no series' manifest matches its files") in flat(cp.stderr)
    assert ("likely cause: torch 2.7.1a0 is not a supported release: this project supports torch "
            + ", ".join(supported_versions())) in flat(cp.stderr)
    assert "nothing was changed" in flat(cp.stderr)
    assert digest(src) == before


def test_configure_sibling_release_served_by_hashes(src, tmp_path):
    """version.txt says 2.15.1, the touched files are 2.15.0's bytes: v2.15.0 serves it,
    and the wheel is versioned after the checkout's release."""
    (src / "version.txt").write_text("2.15.1a0\n")
    cp = configure(tmp_path / "build", f"-DPYTORCH_SOURCE_DIR={src}")
    assert cp.returncode == 0, cp.stderr
    assert (f"{src} is torch 2.15.1 (pristine); series v2.15.0, which serves it: touched files "
            "identical") in flat(cp.stdout)
    assert "wheel version 2.15.1+fakemode.1" in flat(cp.stdout)


def test_configure_rejects_modified_file(src, tmp_path):
    rel = TOUCHED_PRISTINE_FILE
    with open(src / rel, "a") as f:
        f.write("# someone else's edit\n")
    before = digest(src)
    cp = configure(tmp_path / "build", f"-DPYTORCH_SOURCE_DIR={src}")
    assert cp.returncode != 0
    assert f"{rel} (modified)" in flat(cp.stderr)
    assert digest(src) == before


def test_configure_missing_cuda_toolkit(src, tmp_path):
    before = digest(src)
    cp = configure(tmp_path / "b1", f"-DPYTORCH_SOURCE_DIR={src}", "-DUSE_CUDA=ON",
                   f"-DCUDAToolkit_ROOT={tmp_path / 'no-cuda'}")
    assert cp.returncode != 0
    assert f"USE_CUDA=ON but there is no nvcc at {tmp_path / 'no-cuda' / 'bin' / 'nvcc'}" in flat(cp.stderr)
    assert "-DUSE_CUDA=OFF" in cp.stderr
    # without a checkout, and with nvcc hidden from PATH behind a CUDA_HOME that is empty
    cp = configure(tmp_path / "b2", "-DUSE_CUDA=ON",
                   env={"CUDA_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert cp.returncode != 0
    assert f"no nvcc at {tmp_path / 'bin' / 'nvcc'} (from $CUDA_HOME)" in flat(cp.stderr)
    assert digest(src) == before


@pytest.mark.skipif(not shutil.which("nvcc"), reason="no nvcc on PATH")
def test_configure_with_cuda_toolkit(src, tmp_path):
    root, version = sb.find_cuda()
    b = tmp_path / "build"
    cp = configure(b, f"-DPYTORCH_SOURCE_DIR={src}", "-DUSE_CUDA=ON", f"-DCUDAToolkit_ROOT={root}")
    assert cp.returncode == 0, cp.stderr
    assert f"backend CUDA {version} at {root}" in cp.stdout
    cp = cmake("--build", str(b), "--target", "torch_wheel", env={"TORCH_FORK_OVERLAY_DRY_RUN": "1"})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "USE_CUDA=1" in cp.stdout and f"CUDA_HOME={root}" in cp.stdout


def test_other_targets_and_ctest(tmp_path):
    b = tmp_path / "build"
    cp = configure(b, "-DOVERLAY_LABEL=fakemode.2")
    assert cp.returncode == 0, cp.stderr
    assert "PYTORCH_SOURCE_DIR is not set" in cp.stdout
    cp = cmake("--build", str(b), "--target", "overlay_wheel", "--", "-n")  # make -n: print, do not run
    assert f"-m torch_fork_overlay wheel --version 2.15.0 --out-dir {b / 'dist'} --label fakemode.2" in cp.stdout
    cp = cmake("--build", str(b), "--target", "torch_wheel")
    assert cp.returncode != 0 and "torch_wheel needs a PyTorch checkout" in cp.stdout
    cp = subprocess.run(["ctest", "-N", "--test-dir", str(b)], capture_output=True, text=True)
    assert "torch_fork_overlay_tests" in cp.stdout


def _builder_python() -> str:
    """An interpreter whose setuptools can build a wheel without build isolation."""
    probe = ("import setuptools, importlib.util as u; v = tuple(map(int, setuptools.__version__.split('.')[:2]));"
             "raise SystemExit(0 if v >= (70, 1) or u.find_spec('wheel') else 1)")
    for py in (sys.executable, os.environ.get("TORCH_FORK_OVERLAY_PATCHED_PYTHON"),
               os.environ.get("TORCH_FORK_OVERLAY_STOCK_PYTHON")):
        if py and subprocess.run([py, "-c", probe], capture_output=True).returncode == 0:
            return py
    pytest.skip("no interpreter with setuptools >= 70.1 or wheel")


def test_real_build_command_runs(src, tmp_path):
    """The non-dry path runs the build command with its environment (here: a tiny setup.py)."""
    py = _builder_python()
    lines = []
    plan = sb.source_build(pytorch_src=src, python=py, dist_dir=tmp_path / "dist", dry_run=False,
                           label="fakemode.7", echo=lines.append)
    assert plan.wheel.name == "torch-2.15.0+fakemode.7-py3-none-any.whl"
    assert state(src) == {"patched"}
    assert "follow it with: tail -f" in "\n".join(lines)


def test_build_failure_names_the_log(src, tmp_path):
    (src / "setup.py").write_text("raise SystemExit('boom from setup.py')\n")
    with pytest.raises(OverlayError) as e:
        sb.source_build(pytorch_src=src, python=_builder_python(), dist_dir=tmp_path / "dist", dry_run=False,
                        echo=lambda s: None)
    assert "PyTorch's build failed" in e.value.what and "full log:" in e.value.what


def test_missing_build_requirements_change_nothing(src, tmp_path):
    (src / "requirements-build.txt").write_text("setuptools\ntfo-no-such-dist>=1\n")
    before = digest(src)
    with pytest.raises(OverlayError) as e:
        sb.source_build(pytorch_src=src, dist_dir=tmp_path / "dist", dry_run=False, echo=lambda s: None)
    assert "lacks PyTorch's build requirements: tfo-no-such-dist" in e.value.what
    assert f"-m pip install -r {src / 'requirements-build.txt'}" in e.value.next
    assert digest(src) == before


def test_missing_submodules(src, tmp_path):
    (src / ".gitmodules").write_text('[submodule "pybind11"]\n\tpath = third_party/pybind11\n\turl = x\n')
    (src / "third_party" / "pybind11").mkdir(parents=True)
    before = digest(src)
    with pytest.raises(OverlayError) as e:
        sb.source_build(pytorch_src=src, dry_run=True, echo=lambda s: None)
    assert "git submodule(s) not checked out: third_party/pybind11" in e.value.what
    assert "submodule update --init --recursive" in e.value.next
    assert digest(src) == before


def test_bad_label(src):
    with pytest.raises(OverlayError) as e:
        sb.source_build(pytorch_src=src, dry_run=True, label="fake mode", echo=lambda s: None)
    assert "does not make a valid local version" in e.value.what
    assert state(src) == {"pristine"}


def test_cli_error_is_three_parts_without_traceback(tmp_path):
    cp = subprocess.run([sys.executable, "-m", "torch_fork_overlay", "source-build", "--pytorch-src",
                         str(tmp_path / "missing"), "--dry-run"], capture_output=True, text=True, cwd=REPO)
    assert cp.returncode == 2
    assert cp.stderr.startswith(f"error: --pytorch-src {tmp_path / 'missing'} is not a directory\n  likely cause:")
    assert "\n  next: git clone" in cp.stderr and "Traceback" not in cp.stderr
