"""Find a torch install without importing torch.

Importing torch is slow, needs its native libraries, and would run the very
code we may be about to patch; instead we ask the target interpreter for
``importlib.util.find_spec("torch")`` and read ``torch/version.py`` as text.

``torch_dir`` is ``<site-packages>/torch`` as the interpreter sees it, even
when that is a symlink (so RECORD, which lives in site-packages, is found).
With several ``torch-*.dist-info`` folders the one whose RECORD matches the
installed ``torch/__init__.py`` and ``torch/version.py`` is used; if that is
not exactly one, the install is refused as ambiguous.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from pathlib import Path

from packaging.version import Version

from . import state as st
from .errors import OverlayError
from .proc import run
from .series import base_version

_MARK = "torch-fork-overlay-find-spec:"
_FIND_SPEC = (
    "import importlib.util, json; s = importlib.util.find_spec('torch'); "
    f"print({_MARK!r}, json.dumps(s and list(s.submodule_search_locations or [])))"
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

    @property
    def reinstall(self) -> str:
        """The command that puts pristine torch back (pip resolves the public
        version, ``2.15.0``; ``2.15.0+cu132`` would not resolve on PyPI)."""
        try:
            public = Version(self.version).public
        except ValueError:
            public = self.base_version
        return f"pip install --force-reinstall --no-deps torch=={public}"


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


def find_dist_info(site_packages: Path, torch_dir: Path | None = None) -> Path | None:
    """The ``torch-*.dist-info`` of the installed ``torch/`` (None for a checkout)."""
    cands = sorted(p for p in site_packages.glob("torch-*.dist-info") if p.is_dir())
    if len(cands) <= 1:
        return cands[0] if cands else None
    torch_dir = torch_dir or site_packages / "torch"
    matching = [d for d in cands if _record_matches(d, torch_dir)]
    if len(matching) == 1:
        return matching[0]
    raise OverlayError(
        f"{len(cands)} torch dist-info folders in {site_packages} ({', '.join(d.name for d in cands)}) "
        f"and {'none' if not matching else 'more than one'} of them lists the installed "
        "torch/__init__.py and torch/version.py with their current hashes",
        cause="an interrupted or hand-made install or uninstall left a stale dist-info folder, "
        "so which RECORD describes these files is ambiguous",
        next="let pip clean up: pip install --force-reinstall --no-deps torch==<the version you want>, "
        "then rerun",
    )


def _record_matches(dist_info: Path, torch_dir: Path) -> bool:
    try:
        text = (dist_info / "RECORD").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    rows = {p: raw.rstrip("\r\n").split(",") for p, raw in st.split_record(text)}
    for name in ("__init__.py", "version.py"):
        row = rows.get(f"torch/{name}")
        try:
            data = (torch_dir / name).read_bytes()
        except OSError:
            return False
        if not row or len(row) < 2 or row[1] != st.record_hash(data):
            return False
    return True


def _ask_interpreter(py: str) -> list[str] | None:
    if not os.path.isfile(py) or not os.access(py, os.X_OK):
        raise OverlayError(
            f"--python {py} is not an executable file",
            cause="the path is mistyped, or names a directory or a non-executable file",
            next="pass the interpreter of the environment, e.g. --python /path/to/venv/bin/python",
        )
    cp = run(
        [py, "-c", _FIND_SPEC],
        what=f"could not ask {py} where torch is",
        cause="the interpreter path is wrong or it does not start",
        next=f"check it runs: {py} -c 'import sys; print(sys.version)'",
    )
    answer = [line for line in cp.stdout.splitlines() if line.startswith(_MARK + " ")]
    try:
        return json.loads(answer[-1][len(_MARK) + 1:])
    except (IndexError, ValueError):
        said = (cp.stdout + cp.stderr).strip().splitlines()
        raise OverlayError(
            f"--python {py} did not answer like a Python interpreter "
            f"(it printed {said[-1][:200]!r})" if said else
            f"--python {py} did not answer like a Python interpreter (it printed nothing)",
            cause="the path names another program, not python",
            next="pass the interpreter of the environment, e.g. --python /path/to/venv/bin/python",
        ) from None


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
        locs = _ask_interpreter(py)
        if not locs:
            raise OverlayError(
                f"torch is not installed for {py}",
                cause="this interpreter's environment has no torch",
                next=f"{py} -m pip install -r requirements.txt, or pass --python for another env",
            )
        # keep a symlinked torch/ as is: RECORD lives next to the link, not the target
        sp = Path(os.path.abspath(locs[0])).parent.resolve()
        torch_dir = sp / "torch"
        if not (torch_dir / "__init__.py").is_file():
            raise OverlayError(
                f"torch for {py} is an empty namespace package at {torch_dir} (no __init__.py)",
                cause="leftovers of an uninstall keep the torch/ folder importable",
                next=f"reinstall torch into it: {py} -m pip install --force-reinstall torch "
                f"(ls -a {torch_dir} shows what the uninstall left there)",
            )
    version, git_version = _read_version_py(torch_dir)
    di = find_dist_info(sp, torch_dir)
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
