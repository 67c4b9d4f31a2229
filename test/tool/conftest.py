"""Fixtures for the tool's tests: fake installs and fixture series made of
real torch files, never the tool mocked out.

Real files come from a stock torch 2.15.0 install found without importing
torch: $TORCH_FORK_OVERLAY_STOCK_PYTHON (set by tools/test), else the repo's
.venv-stock.  The fixture series is generated with the tool's own refresh.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from torch_fork_overlay import refresh  # noqa: E402

# Files copied into each fake install (cheap: ~200 KB plus RECORD).
FAKE_FILES = ["torch/__init__.py", "torch/version.py", "torch/_guards.py", "torch/_dynamo/config.py"]


def _stock_python() -> str | None:
    env = os.environ.get("TORCH_FORK_OVERLAY_STOCK_PYTHON")
    if env:
        return env
    cand = REPO / ".venv-stock" / "bin" / "python"
    return str(cand) if cand.exists() else None


@pytest.fixture(scope="session")
def stock_site_packages() -> Path:
    py = _stock_python()
    if py is None:
        pytest.skip("no stock torch: run tools/test or set TORCH_FORK_OVERLAY_STOCK_PYTHON")
    out = subprocess.run(
        [py, "-c", "import importlib.util as u; print(u.find_spec('torch').submodule_search_locations[0])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    sp = Path(out).parent
    assert (sp / "torch" / "version.py").read_text().count("2.15.0"), sp
    return sp


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 + mode of every file under root, for 'nothing changed' checks."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() + f" {p.stat().st_mode:o}"
        else:
            out[rel] = "dir"
    return out


def make_fake_install(dest: Path, stock: Path) -> Path:
    sp = dest / "site-packages"
    for rel in FAKE_FILES:
        (sp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(stock / rel, sp / rel)
    (di,) = stock.glob("torch-*.dist-info")
    (sp / di.name).mkdir()
    for name in ("METADATA", "RECORD", "WHEEL"):
        shutil.copyfile(di / name, sp / di.name / name)
    return sp


@pytest.fixture
def fake_install(tmp_path, stock_site_packages) -> Path:
    return make_fake_install(tmp_path, stock_site_packages)


def _edit(tree: Path, stock: Path, rel: str, old: str, new: str) -> None:
    p = tree / rel
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(stock / rel, p)
    text = p.read_text()
    assert text.count(old) == 1, (rel, old)
    p.write_text(text.replace(old, new))


GUARDS_OLD = "    # If TracingContext has a fake_mode, use it authoritatively.\n"
GUARDS_NEW = "    # fixture: patched by test/tool\n" + GUARDS_OLD


@pytest.fixture(scope="session")
def series_template(tmp_path_factory, stock_site_packages) -> Path:
    """patches/v2.15.0 with three real patches made by refresh:
    0001 edits torch/_guards.py, 0002 edits torch/_dynamo/config.py,
    0003 adds test/dynamo/test_fixture.py (a test-only patch)."""
    base = tmp_path_factory.mktemp("series")
    pdir, tree = base / "patches", base / "tree"
    pristine = refresh.Pristine(tree=stock_site_packages)
    config = (stock_site_packages / "torch/_dynamo/config.py").read_text()
    config_old = next(l for l in config.splitlines(True) if l.startswith("import "))
    msgs = {}
    for i, subject in enumerate(["guards: Mark detect_fake_mode", "dynamo: Mark config",
                                 "test: Add fixture test"], 1):
        msgs[i] = base / f"msg{i}"
        msgs[i].write_text(f"{subject}\n\nFixture patch {i} for the tool's tests.\n")
    _edit(tree, stock_site_packages, "torch/_guards.py", GUARDS_OLD, GUARDS_NEW)
    refresh.new_patch(version="2.15.0", pristine=pristine, tree=tree, files=["torch/_guards.py"],
                      message_file=msgs[1], patches_dir=pdir)
    _edit(tree, stock_site_packages, "torch/_dynamo/config.py", config_old,
          config_old + "# fixture: patched by test/tool\n")
    refresh.new_patch(version="2.15.0", pristine=pristine, tree=tree,
                      files=["torch/_dynamo/config.py"], message_file=msgs[2], patches_dir=pdir)
    (tree / "test/dynamo").mkdir(parents=True)
    (tree / "test/dynamo/test_fixture.py").write_text("# Owner(s): [\"module: dynamo\"]\n")
    refresh.new_patch(version="2.15.0", pristine=pristine, tree=tree,
                      files=["test/dynamo/test_fixture.py"], message_file=msgs[3], patches_dir=pdir)
    return pdir


@pytest.fixture
def patches_dir(tmp_path, series_template) -> Path:
    """A private copy of the fixture series that a test may break."""
    dest = tmp_path / "patches"
    shutil.copytree(series_template, dest)
    return dest


def run_cli(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torch_fork_overlay", *args], cwd=REPO,
                          capture_output=True, text=True, **kw)


# -- a synthetic install: no real torch needed (the crash-safety tests) ------

SYNTH_DIST_INFO = "torch-2.15.0.dist-info"


def synthetic_files(version: str = "2.15.0+cu132", flavour: str = "") -> dict[str, bytes]:
    """Small stand-ins for torch files, laid out like site-packages.  Another
    ``flavour`` gives another release's bytes for the touched files."""
    guards = "".join(f"def guard_{i}(x):\n    return x + {i}\n\n" for i in range(800)) + flavour
    config = "import os\nimport sys\n\n" + "".join(f"option_{i} = {i}\n" for i in range(400)) + flavour
    return {
        "torch/__init__.py": b'"""synthetic torch for torch_fork_overlay tests"""\n',
        "torch/version.py": f"__version__ = '{version}'\ngit_version = 'synthetic0123456789'\n".encode(),
        "torch/_guards.py": guards.encode(),
        "torch/_dynamo/__init__.py": b"",
        "torch/_dynamo/config.py": config.encode(),
    }


def make_synthetic_install(dest: Path, *, version: str = "2.15.0+cu132", flavour: str = "",
                           local_in_metadata: bool = False) -> Path:
    """``dest/site-packages`` with torch/ and a RECORD written the way pip writes it.
    The dist-info carries the local label only with ``local_in_metadata`` (as
    the CPU wheels do: ``torch-2.13.0+cpu.dist-info``; the CUDA ones do not)."""
    import csv
    import io

    from torch_fork_overlay import state as st

    sp = dest / "site-packages"
    files = synthetic_files(version, flavour)
    public = version if local_in_metadata else version.split("+")[0]
    di = SYNTH_DIST_INFO if public == "2.15.0" else f"torch-{public}.dist-info"
    files[f"{di}/METADATA"] = f"Metadata-Version: 2.1\nName: torch\nVersion: {public}\n".encode()
    files[f"{di}/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"
    for rel, data in files.items():
        (sp / rel).parent.mkdir(parents=True, exist_ok=True)
        (sp / rel).write_bytes(data)
    buf = io.StringIO()
    w = csv.writer(buf)  # pip's RECORD: csv with \r\n line ends
    for rel, data in files.items():
        w.writerow([rel, st.record_hash(data), len(data)])
    w.writerow([f"{di}/RECORD", "", ""])
    (sp / di / "RECORD").write_bytes(buf.getvalue().encode())
    return sp


def make_synthetic_series(base: Path, pdir: Path, *, release: str = "2.15.0", flavour: str = "") -> Path:
    """``pdir/v<release>`` for the synthetic install of that flavour, made by
    refresh: 0001 edits torch/_guards.py, 0002 torch/_dynamo/config.py, 0003
    adds a test file.  ``base`` is a scratch folder."""
    pristine_sp = make_synthetic_install(base / "pristine", version=release, flavour=flavour)
    pristine = refresh.Pristine(tree=pristine_sp)
    tree = base / "tree"
    edits = [
        ("torch/_guards.py", "def guard_7(x):\n", "def guard_7(x):\n    # patched by test/tool\n"),
        ("torch/_dynamo/config.py", "import sys\n", "import sys\n# patched by test/tool\n"),
    ]
    for i, (rel, old, new) in enumerate(edits, 1):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text((pristine_sp / rel).read_text().replace(old, new, 1))
        msg = base / f"msg{i}"
        msg.write_text(f"area: Synthetic patch {i}\n\nFor the crash-safety tests.\n")
        refresh.new_patch(version=release, pristine=pristine, tree=tree, files=[rel],
                          message_file=msg, patches_dir=pdir)
    (tree / "test/dynamo").mkdir(parents=True)
    (tree / "test/dynamo/test_synthetic.py").write_text("# synthetic\n")
    (base / "msg3").write_text("test: Add a synthetic test\n")
    refresh.new_patch(version=release, pristine=pristine, tree=tree,
                      files=["test/dynamo/test_synthetic.py"], message_file=base / "msg3",
                      patches_dir=pdir)
    return pdir / f"v{release}"


@pytest.fixture(scope="session")
def synthetic_series(tmp_path_factory) -> Path:
    """patches/v2.15.0 for the synthetic install (see ``make_synthetic_series``)."""
    base = tmp_path_factory.mktemp("synth-series")
    make_synthetic_series(base, base / "patches")
    return base / "patches"


@pytest.fixture
def synth(tmp_path, synthetic_series) -> tuple[Path, Path]:
    """(site-packages of a fresh synthetic install, a private copy of its series)."""
    dest = tmp_path / "patches"
    shutil.copytree(synthetic_series, dest)
    return make_synthetic_install(tmp_path / "install"), dest
