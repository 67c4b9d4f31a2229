"""``refresh``: regenerate patches from edited trees; never hand-edit a patch.

Each patch is the diff of its files between *pristine + earlier patches* and
an edited tree, made in a throwaway git repository with
``git format-patch --zero-commit --no-signature -N`` so that regenerating an
unchanged patch reproduces it byte for byte.  Pristine files come from an
installed stock torch or any tree laid out like the PyTorch repo root
(``--pristine DIR``, e.g. a stock venv's site-packages) or straight from the
official wheel (``--pristine-wheel WHL``, read with ``wheel.wheelfile``,
which checks RECORD hashes).  A file absent from the pristine tree (a new
``test/dynamo/test_*.py``) becomes a new-file diff.  The edited file in
``--tree`` must hold the state after this patch *and all earlier ones*.
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
from pathlib import Path

from . import state as st
from .apply import patch_tree
from .errors import OverlayError
from .proc import run
from .series import (
    SERIES,
    Series,
    check_relpath,
    default_patches_dir,
    load_series,
    read_series_names,
    write_manifest,
)

# The author of a new patch is $GIT_AUTHOR_NAME / $GIT_AUTHOR_EMAIL when set;
# user git config is ignored so that hooks or signing settings cannot leak in.
_IDENT = {
    "GIT_AUTHOR_NAME": os.environ.get("GIT_AUTHOR_NAME", "torch-fork-overlay"),
    "GIT_AUTHOR_EMAIL": os.environ.get("GIT_AUTHOR_EMAIL", "torch-fork-overlay@localhost"),
    "GIT_COMMITTER_NAME": "torch-fork-overlay",
    "GIT_COMMITTER_EMAIL": "torch-fork-overlay@localhost",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


class Pristine:
    """Read pristine files of a release from a tree or the official wheel."""

    def __init__(self, *, tree: str | os.PathLike[str] | None = None,
                 wheel: str | os.PathLike[str] | None = None) -> None:
        if (tree is None) == (wheel is None):
            raise OverlayError(
                "refresh needs the pristine files: exactly one of --pristine and --pristine-wheel",
                cause="both or neither were given",
                next="pass a stock torch's site-packages, e.g. --pristine "
                "$(.venv-stock/bin/python -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))')",
            )
        self.tree = Path(tree) if tree is not None else None
        self._wf = None
        if wheel is not None:
            from wheel.wheelfile import WheelFile

            try:
                self._wf = WheelFile(str(wheel))
            except Exception as e:  # zipfile.BadZipFile, WheelError, OSError
                raise OverlayError(
                    f"cannot read pristine wheel {wheel} ({e})",
                    cause="the file is missing, not a wheel, or corrupt",
                    next="pass the official wheel, or --pristine DIR with a stock torch",
                ) from None
            self._names = set(self._wf.namelist())

    def read(self, rel: str) -> bytes | None:
        if self.tree is not None:
            p = self.tree / rel
            return p.read_bytes() if p.is_file() else None
        if rel not in self._names:
            return None
        return self._wf.read(rel)  # WheelFile verifies the RECORD hash


def _git(repo: Path, *args: str, **kw):
    return run(["git", *args], cwd=repo, env={**_IDENT, "GIT_CEILING_DIRECTORIES": str(repo.parent)}, **kw)


def _write(root: Path, rel: str, data: bytes | None) -> None:
    p = root / rel
    if data is None:
        p.unlink(missing_ok=True)
        return
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def _sub_series(series: Series, names: list[str]) -> Series:
    by = {p.name: p for p in series.patches}
    return Series(version=series.version, dir=series.dir,
                  patches=[by[n] for n in names], manifest=series.manifest)


def _base_repo(tmp: Path, *, series: Series, pristine: Pristine, extra: list[str], before: list[str]) -> Path:
    """A git repo holding pristine files + the patches named in ``before``."""
    repo = tmp / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    files = sorted({f for p in series.patches for f in p.files} | set(extra))
    for rel in files:
        _write(repo, rel, pristine.read(rel))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--allow-empty", "-m", f"pristine torch {series.version}")
    if before:
        patch_tree(root=repo, series=_sub_series(series, before), include_tests=True)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "--allow-empty", "-m", "earlier patches")
    return repo


def _take_from_tree(repo: Path, *, tree: Path, files: list[str]) -> None:
    for rel in files:
        src = tree / rel
        _write(repo, rel, src.read_bytes() if src.is_file() else None)
    _git(repo, "add", "-A", "--", *files)
    if not _git(repo, "diff", "--cached", "--name-only").stdout.strip():
        raise OverlayError(
            f"{', '.join(files)} in {tree} are identical to pristine + earlier patches",
            cause="the edits were made elsewhere, or --tree points at the wrong directory",
            next="edit the files under --tree (or fix the path) and rerun refresh",
        )


def _trailers(repo: Path, *, version: str) -> None:
    msg = _git(repo, "log", "-1", "--format=%B").stdout
    today = datetime.date.today().isoformat()
    cp = _git(repo, "interpret-trailers",
              "--if-exists", "replace", "--trailer", f"Applies-To: torch {version}",
              "--if-exists", "doNothing", "--trailer", "Forwarded: not-yet",
              "--if-exists", "replace", "--trailer", f"Last-Update: {today}", input=msg)
    _git(repo, "commit", "-q", "--amend", "--allow-empty", "-F", "-", input=cp.stdout)


def _format_patch(repo: Path) -> tuple[str, str]:
    out = repo.parent / "out"
    cp = _git(repo, "format-patch", "--zero-commit", "--no-signature", "-N",
               "--filename-max-length=200", "-1", "HEAD", "-o", str(out))
    path = Path(cp.stdout.strip().splitlines()[-1])
    return path.name, path.read_text(encoding="utf-8")


def _diff_part(text: str) -> str:
    i = text.find("\ndiff --git ")
    return text[i:] if i >= 0 else text


def _check_later(repo: Path, *, series: Series, later: list[str]) -> None:
    if later:
        patch_tree(root=repo, series=_sub_series(series, later), include_tests=True)


def _write_series_file(series_dir: Path, lines_edit) -> None:
    path = series_dir / SERIES
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else [
        "# Patches in apply order (quilt style; '#' starts a comment).",
        "# Written by `python -m torch_fork_overlay refresh`; regenerate, do not hand-edit patches.",
    ]
    path.write_text("\n".join(lines_edit(lines)) + "\n", encoding="utf-8")


def new_patch(
    *,
    version: str,
    pristine: Pristine,
    tree: str | os.PathLike[str],
    files: list[str],
    message_file: str | os.PathLike[str],
    name: str | None = None,
    replace: str | None = None,
    patches_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Create a patch of ``files`` as edited in ``tree`` with the commit message
    in ``message_file``; append it to the series, or put it in place of the
    patch ``replace`` (whose file is deleted). Rewrites the manifest."""
    root = Path(patches_dir) if patches_dir is not None else default_patches_dir()
    sdir = root / f"v{version}"
    for f in files:
        check_relpath(f, where="--files")
    sdir.mkdir(parents=True, exist_ok=True)
    if not (sdir / SERIES).exists():
        _write_series_file(sdir, lambda lines: lines)
    series = load_series(version, patches_dir=root, require_manifest=False)
    names = [p.name for p in series.patches]
    if replace is not None and replace not in names:
        raise OverlayError(
            f"--replace {replace}: no such patch in {sdir / SERIES}",
            cause="the name is mistyped", next=f"cat {sdir / SERIES}")
    pos = names.index(replace) if replace else len(names)
    before, later = names[:pos], names[pos + 1 if replace else pos:]
    with tempfile.TemporaryDirectory(prefix="tfo-refresh-") as tmp:
        repo = _base_repo(Path(tmp), series=series, pristine=pristine, extra=files, before=before)
        _take_from_tree(repo, tree=Path(tree), files=files)
        _git(repo, "commit", "-q", "-F", str(Path(message_file).resolve()))
        _trailers(repo, version=series.version)
        fp_name, text = _format_patch(repo)
        _check_later(repo, series=series, later=later)
    name = name or f"{pos + 1:04d}-{fp_name.split('-', 1)[1]}"
    check_relpath(name, where="--name")
    (sdir / name).write_text(text, encoding="utf-8")

    def edit(lines: list[str]) -> list[str]:
        if replace:
            return [name if l.split("#", 1)[0].strip().split()[:1] == [replace] else l for l in lines]
        return lines + [name]

    _write_series_file(sdir, edit)
    if replace and replace != name:
        (sdir / replace).unlink()
    write_series_manifest(version=version, pristine=pristine, patches_dir=root)
    print(f"wrote {sdir / name} and updated {sdir / SERIES} and {sdir / 'manifest.json'}")
    return sdir / name


def regenerate_patch(
    *,
    version: str,
    pristine: Pristine,
    tree: str | os.PathLike[str],
    patch: str,
    patches_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Regenerate ``patch`` from ``tree`` keeping its message, author and date.
    An unchanged diff leaves the file untouched (no churn)."""
    root = Path(patches_dir) if patches_dir is not None else default_patches_dir()
    series = load_series(version, patches_dir=root, require_manifest=False)
    names = [p.name for p in series.patches]
    if patch not in names:
        raise OverlayError(f"no patch {patch} in {series.dir / SERIES}",
                           cause="the name is mistyped", next=f"cat {series.dir / SERIES}")
    pos = names.index(patch)
    old = series.patches[pos]
    with tempfile.TemporaryDirectory(prefix="tfo-refresh-") as tmp:
        repo = _base_repo(Path(tmp), series=series, pristine=pristine, extra=[], before=names[:pos])
        # git am keeps the message, author and date of the existing patch
        _git(repo, "am", "-q", "--keep-cr", str(old.path.resolve()),
             what=f"{patch} does not apply to pristine + earlier patches",
             cause="an earlier patch changed under it",
             next="regenerate the earlier patches first, in series order")
        for rel in old.files:
            src = Path(tree) / rel
            _write(repo, rel, src.read_bytes() if src.is_file() else None)
        _git(repo, "add", "-A", "--", *old.files)
        _git(repo, "commit", "-q", "--amend", "--allow-empty", "--no-edit")
        _, text = _format_patch(repo)
        old_text = old.path.read_text(encoding="utf-8")
        if _diff_part(text) == _diff_part(old_text):
            print(f"{old.path}: unchanged")
            write_series_manifest(version=version, pristine=pristine, patches_dir=root)
            return old.path
        _trailers(repo, version=series.version)
        _, text = _format_patch(repo)
        _check_later(repo, series=series, later=names[pos + 1:])
    old.path.write_text(text, encoding="utf-8")
    write_series_manifest(version=version, pristine=pristine, patches_dir=root)
    print(f"regenerated {old.path} and rewrote {series.dir / 'manifest.json'}")
    return old.path


def write_series_manifest(
    *, version: str, pristine: Pristine, patches_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Rewrite ``manifest.json`` from pristine files + the whole series."""
    series = load_series(version, patches_dir=patches_dir, require_manifest=False)
    files = sorted({f for p in series.install_patches() for f in p.files if not f.startswith("test/")})
    manifest: dict[str, dict[str, str | None]] = {}
    with tempfile.TemporaryDirectory(prefix="tfo-manifest-") as tmp:
        tmp = Path(tmp)
        for rel in files:
            data = pristine.read(rel)
            _write(tmp, rel, data)
            manifest[rel] = {"pristine": st.sha256_bytes(data) if data is not None else None}
        patch_tree(root=tmp, series=series, include_tests=False)
        for rel in files:
            h = st.sha256_file(tmp / rel)
            if h is None:
                raise OverlayError(f"the v{version} series deletes {rel}",
                                   cause="deleting files from an install is not supported",
                                   next="change the patch to edit the file instead")
            manifest[rel]["patched"] = h
    return write_manifest(series.dir, version=series.version, files=manifest)
