"""Patch series: ``patches/v<release>/{series,manifest.json,NNNN-*.patch}``.

The layout follows quilt and Debian DEP-3: ``series`` lists the patch files in
apply order (``#`` starts a comment), each patch is a ``git format-patch`` file
whose paths are ``-p1`` relative to the PyTorch repository root, and
``manifest.json`` records, for every touched file outside ``test/``, the
sha256 of the pristine file of that release and of the fully patched result.

A folder is named after the release it was made for, ``v2.15.0``; a local
label belongs in the name only when that build's touched files differ from
the plain release's (``v2.13.0+cpu``).  Other files in a folder (a README
saying how this release's series differs from the newest one) are ignored.
Which series serves a given torch is decided by hashes: see ``releases``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import re
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .errors import OverlayError

ENV_PATCHES = "TORCH_FORK_OVERLAY_PATCHES"
MANIFEST = "manifest.json"
SERIES = "series"


def default_patches_dir() -> Path:
    """``$TORCH_FORK_OVERLAY_PATCHES``, else ``patches/`` of the source
    checkout this package runs from, else the copy shipped as package data."""
    env = os.environ.get(ENV_PATCHES)
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    checkout = here.parent / "patches"
    if checkout.is_dir():
        return checkout
    return here / "_patches"


def base_version(version: str) -> str:
    """``2.15.0+cu132`` -> ``2.15.0`` (also drops dev/pre suffixes)."""
    try:
        return Version(version).base_version
    except InvalidVersion:
        raise OverlayError(
            f"{version!r} is not a valid torch version",
            cause="the version string was mistyped or torch/version.py is damaged",
            next="pass a release such as --version 2.15.0",
        ) from None


@dataclasses.dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    files: tuple[str, ...]  # every path the diff touches, -p1, repo-root relative
    new_files: tuple[str, ...]  # subset of ``files`` created by the patch

    @property
    def is_test(self) -> bool:
        """True when every touched path is under ``test/`` (upstream tests)."""
        return all(f.startswith("test/") for f in self.files)


@dataclasses.dataclass(frozen=True)
class Series:
    version: str
    dir: Path
    patches: list[Patch]
    # {relpath: {"pristine": sha256 | None, "patched": sha256}} for non-test files
    manifest: dict[str, dict[str, str | None]]

    def install_patches(self) -> list[Patch]:
        """The patches applied to an install (tests are skipped)."""
        return [p for p in self.patches if not p.is_test]

    def install_files(self) -> list[str]:
        return sorted(self.manifest)


_DIFF_GIT = re.compile(r"^diff --git a/(\S+) b/(\S+)$")


def check_relpath(path: str, *, where: str) -> str:
    """Reject paths that escape the tree they are applied to."""
    norm = posixpath.normpath(path)
    if (
        not path
        or path.startswith("/")
        or "\\" in path
        or norm == ".."
        or norm.startswith("../")
        or ".." in path.split("/")
    ):
        raise OverlayError(
            f"{where} touches {path!r}, which escapes the tree it applies to",
            cause="the patch was written by hand or with the wrong -p level; "
            "patch paths must be relative to the PyTorch repository root",
            next="regenerate it with: python -m torch_fork_overlay refresh --help",
        )
    return path


def read_patch_text(path: Path, *, what: str = "patch") -> str:
    """A patch (or series) file as text; a byte that is not UTF-8 is an ``OverlayError``."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise OverlayError(
            f"{what} {path} is not UTF-8 text: byte 0x{raw[e.start]:02x} at line {line}",
            cause="the file was damaged or edited by hand with another encoding "
            "(patches are made by refresh, as UTF-8)",
            next=f"see what changed: git diff -- {path}, then regenerate it: "
            "python -m torch_fork_overlay refresh --help",
        ) from None


def parse_patch_files(path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Return (touched files, new files) of a ``git format-patch`` file."""
    files: list[str] = []
    new: list[str] = []
    where = f"patch {path.name}"
    current: str | None = None
    for line in read_patch_text(path).splitlines():
        m = _DIFF_GIT.match(line)
        if m:
            a, b = m.groups()
            for p in (a, b):
                check_relpath(p, where=where)
            current = b
            if b not in files:
                files.append(b)
        elif line.startswith(("--- ", "+++ ")) and current is not None:
            p = line[4:].split("\t")[0]
            if p != "/dev/null":
                if not p.startswith(("a/", "b/")):
                    check_relpath(p, where=where)
                check_relpath(p[2:], where=where)
        elif line.startswith("new file mode") and current is not None:
            new.append(current)
        elif line.startswith(("rename ", "copy ")):
            check_relpath(line.split(" ", 2)[2], where=where)
    if not files:
        raise OverlayError(
            f"patch {path} contains no 'diff --git' sections",
            cause="it is not a git format-patch file, or it is empty",
            next="regenerate it with: python -m torch_fork_overlay refresh --help",
        )
    return tuple(files), tuple(new)


def patches_root(patches_dir: str | os.PathLike[str] | None = None) -> Path:
    return Path(patches_dir) if patches_dir is not None else default_patches_dir()


def supported_versions(patches_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Releases that have a series, oldest first (``["2.15.0"]``)."""
    root = patches_root(patches_dir)
    out = []
    if root.is_dir():
        for d in root.iterdir():
            if d.name.startswith("v") and (d / SERIES).is_file():
                try:
                    Version(d.name[1:])
                except InvalidVersion:
                    continue
                out.append(d.name[1:])
    return sorted(out, key=Version)


def read_series_names(series_file: Path) -> list[str]:
    names = []
    for line in read_patch_text(series_file, what="series file").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            # quilt allows "name -p1"; we only support -p1
            names.append(line.split()[0])
    return names


def own_release(version: str, patches_dir: str | os.PathLike[str] | None = None) -> str | None:
    """The folder release made for ``version``: ``v<version>`` itself when it
    exists (``2.13.0+cpu``), else ``v<base version>``; None when neither has a
    series.  Only the folder name is looked at: whether that series really
    serves a given torch is for its hashes to say (``releases``)."""
    root = patches_root(patches_dir)
    base = base_version(version)
    for cand in dict.fromkeys([version, base]):
        if (root / f"v{cand}" / SERIES).is_file():
            return cand
    return None


def load_series(
    version: str,
    *,
    patches_dir: str | os.PathLike[str] | None = None,
    require_manifest: bool = True,
) -> Series:
    """Load the series folder made for ``version`` (see ``own_release``).

    Raises ``OverlayError`` when there is no such folder (listing the
    supported releases), a listed patch is missing, a patch path escapes the
    repository root, or the manifest does not cover the touched files.
    """
    root = patches_root(patches_dir)
    base = own_release(version, root) or base_version(version)
    d = root / f"v{base}"
    if not (d / SERIES).is_file():
        supported = supported_versions(root)
        raise OverlayError(
            f"no patch series for torch {version} in {root}",
            cause=f"this project supports torch {', '.join(supported) or '(none)'}; "
            f"there is no {d / SERIES}",
            next=(
                f"pip install torch=={supported[-1]}, or build a patched wheel of a "
                f"supported release: python -m torch_fork_overlay wheel --version {supported[-1]}"
                if supported
                else "point --patches-dir (or $TORCH_FORK_OVERLAY_PATCHES) at a patches/ folder"
            ),
        )
    patches = []
    for name in read_series_names(d / SERIES):
        check_relpath(name, where=f"{d / SERIES}")
        p = d / name
        if not p.is_file():
            raise OverlayError(
                f"patch {name} listed in {d / SERIES} does not exist",
                cause="the series file and the patch files are out of sync",
                next=f"restore {p} (git checkout -- {p}) or remove it from {d / SERIES}",
            )
        files, new = parse_patch_files(p)
        patches.append(Patch(name=name, path=p, files=files, new_files=new))
    manifest: dict[str, dict[str, str | None]] = {}
    mpath = d / MANIFEST
    if mpath.is_file():
        manifest = read_manifest(mpath, base)
    series = Series(version=base, dir=d, patches=patches, manifest=manifest)
    needed = {f for p in series.install_patches() for f in p.files if not f.startswith("test/")}
    missing = sorted(needed - set(manifest))
    if missing and require_manifest:
        raise OverlayError(
            f"{mpath} does not list {', '.join(missing)} touched by the v{base} series",
            cause="a patch was added or regenerated without rewriting the manifest",
            next=f"rewrite it: python -m torch_fork_overlay refresh --manifest-only --version {base}",
        )
    return series


_SHA256 = re.compile(r"[0-9a-f]{64}")


def read_manifest(mpath: Path, base: str) -> dict[str, dict[str, str | None]]:
    problem = None
    try:
        files = json.loads(mpath.read_bytes().decode("utf-8"))["files"]
        if not isinstance(files, dict):
            problem = "'files' is not a table"
    except (ValueError, KeyError, TypeError) as e:  # UnicodeDecodeError is a ValueError
        problem = f"{type(e).__name__}: {e}"
    if problem is None:
        for rel, v in files.items():
            if not isinstance(v, dict) or set(v) != {"pristine", "patched"}:
                problem = f"the entry of {rel} must have exactly 'pristine' and 'patched', not {v!r}"
            elif not (v["pristine"] is None or _SHA256.fullmatch(str(v["pristine"]))) \
                    or not _SHA256.fullmatch(str(v["patched"])):
                problem = f"the entry of {rel} holds something other than sha256 hex digests: {v!r}"
            else:
                continue
            break
    if problem:
        raise OverlayError(
            f"{mpath} is not a valid manifest ({problem})",
            cause="it was edited by hand or truncated",
            next=f"rewrite it: python -m torch_fork_overlay refresh --manifest-only --version {base} "
            "--pristine DIR",
        )
    return files


def write_manifest(
    series_dir: Path, *, version: str, files: dict[str, dict[str, str | None]]
) -> Path:
    data = {
        "comment": "Written by `python -m torch_fork_overlay refresh`; do not edit. "
        "sha256 of each touched non-test file in pristine torch and after the whole series.",
        "torch": version,
        "files": {k: files[k] for k in sorted(files)},
    }
    path = series_dir / MANIFEST
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path
