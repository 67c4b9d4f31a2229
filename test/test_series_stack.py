"""The default release's series as a stack: generated from fix/ (never edited by
hand), and every prefix of it applies to stock torch and imports.

Needs the stock interpreter ($TORCH_FORK_OVERLAY_STOCK_PYTHON, set by
tools/test) and, for the generated-series check, the official wheel of the
release in .cache/wheels (tools/bootstrap downloads it to build the patched
wheel).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from torch_fork_overlay import generate as g  # noqa: E402
from torch_fork_overlay.apply import patch_tree  # noqa: E402
from torch_fork_overlay.releases import default_release  # noqa: E402
from torch_fork_overlay.series import load_series  # noqa: E402

RELEASE = default_release(REPO / "requirements.txt")
STOCK = os.environ.get("TORCH_FORK_OVERLAY_STOCK_PYTHON")
CACHE = REPO / ".cache"

SMOKE = """
import torch, torch._dynamo
assert torch.__file__.startswith({root!r}), torch.__file__
print(torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2)).tolist())
"""


def _stock_site_packages() -> Path:
    out = subprocess.run([STOCK, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    return Path(out)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system
        shutil.copy2(src, dst)


@pytest.mark.skipif(not any((CACHE / "wheels").glob(f"torch-{RELEASE}-*.whl")),
                    reason=f"no official torch {RELEASE} wheel in .cache/wheels (tools/bootstrap fetches it)")
def test_default_series_is_what_fix_generates():
    stale = g.generate(versions=[RELEASE], cache_dir=CACHE, check=True, out=lambda s: None)
    assert stale == [], "patches/ differ from fix/: run python -m torch_fork_overlay generate"


@pytest.mark.skipif(STOCK is None, reason="needs TORCH_FORK_OVERLAY_STOCK_PYTHON (tools/test sets it)")
def test_every_prefix_of_the_default_stack_applies_and_imports(tmp_path):
    series = load_series(RELEASE)
    assert len(series.install_patches()) >= 3
    # A copy of stock torch whose files are hard links: git apply writes each
    # patched file anew, so the stock install is never touched.
    shutil.copytree(_stock_site_packages() / "torch", tmp_path / "torch", copy_function=_link_or_copy)
    for i, patch in enumerate(series.patches, 1):
        patch_tree(root=tmp_path, series=dataclasses.replace(series, patches=[patch]), include_tests=False)
        cp = subprocess.run([STOCK, "-c", SMOKE.format(root=str(tmp_path))], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=600)
        assert cp.returncode == 0 and "[2.0, 2.0]" in cp.stdout, (
            f"torch with patches 1-{i} of {series.dir} ({patch.name}) does not import:\n{cp.stderr[-3000:]}")
