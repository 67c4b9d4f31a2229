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
