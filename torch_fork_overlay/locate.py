"""Find a torch install without importing torch.

Importing torch is slow, needs its native libraries, and would run the very
code we may be about to patch; instead we ask the target interpreter for
``importlib.util.find_spec("torch")`` and read ``torch/version.py`` as text.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from pathlib import Path

from .errors import OverlayError
from .proc import run
from .series import base_version

_FIND_SPEC = (
    "import importlib.util, json; s = importlib.util.find_spec('torch'); "
    "print(json.dumps(s and list(s.submodule_search_locations or [])))"
)


@dataclasses.dataclass(frozen=True)
class TorchInstall:
    version: str  # torch.__version__, e.g. "2.15.0+cu132"
    base_version: str  # "2.15.0"
    git_version: str
    torch_dir: Path
    site_packages: Path
    dist_info: Path | None
    record: Path | None


def _read_version_py(torch_dir: Path) -> tuple[str, str]:
    vpy = torch_dir / "version.py"
    try:
        text = vpy.read_text(encoding="utf-8")
    except OSError as e:
        raise OverlayError(
            f"cannot read {vpy} ({e.strerror})",
            cause="the torch install is incomplete or is a source checkout that was never built",
            next="reinstall torch: pip install --force-reinstall torch",
        ) from None
    ver = re.search(r"^__version__\s*(?::\s*str)?\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    git = re.search(r"^git_version\s*(?::\s*str)?\s*=\s*['\"]([^'\"]*)['\"]", text, re.M)
    if not ver:
        raise OverlayError(
            f"{vpy} has no __version__ line",
            cause="torch/version.py was edited or the install is damaged",
            next="reinstall torch: pip install --force-reinstall torch",
        )
    return ver.group(1), git.group(1) if git else "Unknown"


def find_dist_info(site_packages: Path) -> Path | None:
    """The ``torch-*.dist-info`` next to ``torch/`` (None for a checkout)."""
    cands = sorted(site_packages.glob("torch-*.dist-info"))
    return cands[0] if cands else None


def locate(
    *, python: str | None = None, site_packages: str | os.PathLike[str] | None = None
) -> TorchInstall:
    """Locate torch in ``site_packages``, or importable by ``python``
    (default: the interpreter running this tool)."""
    if site_packages is not None:
        sp = Path(site_packages).resolve()
        torch_dir = sp / "torch"
        if not (torch_dir / "__init__.py").is_file():
            raise OverlayError(
                f"no torch package in {sp}",
                cause="the --site-packages directory is wrong or torch is not installed there",
                next=f"check with: ls {sp}, or pass --python /path/to/venv/bin/python instead",
            )
    else:
        py = python or sys.executable
        cp = run(
            [py, "-c", _FIND_SPEC],
            what=f"could not ask {py} where torch is",
            cause="the interpreter path is wrong or it does not start",
            next=f"check it runs: {py} -c 'import sys; print(sys.version)'",
        )
        locs = json.loads(cp.stdout.strip().splitlines()[-1])
        if not locs:
            raise OverlayError(
                f"torch is not installed for {py}",
                cause="this interpreter's environment has no torch",
                next=f"{py} -m pip install -r requirements.txt, or pass --python for another env",
            )
        torch_dir = Path(locs[0]).resolve()
        sp = torch_dir.parent
    version, git_version = _read_version_py(torch_dir)
    di = find_dist_info(sp)
    record = di / "RECORD" if di and (di / "RECORD").is_file() else None
    return TorchInstall(
        version=version,
        base_version=base_version(version),
        git_version=git_version,
        torch_dir=torch_dir,
        site_packages=sp,
        dist_info=di,
        record=record,
    )
