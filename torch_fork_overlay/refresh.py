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

Nothing in ``patches/`` changes until the result is known good: every change
is made in a candidate copy of the series folder, which must then load, apply
as a whole (tests included) to pristine files and match its rewritten
manifest; only then are the changed files moved in (each atomically, new
patches first, the series file and deletions last), under a lock per patches
folder so that two refreshes never interleave.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from . import journal as jn
from . import lock
from . import state as st
from .apply import patch_tree
from .errors import OverlayError
from .proc import run
from .series import (
    MANIFEST,
    SERIES,
    Series,
    check_relpath,
    default_patches_dir,
    load_series,
    read_patch_text,
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


def _check_tree(tree: Path, files: list[str] | tuple[str, ...], *, what: str) -> None:
    """Every file of the patch must be in ``tree``: a missing one would
    become a deletion of that file."""
    missing = [rel for rel in files if not (tree / rel).is_file()]
    if missing:
        raise OverlayError(
            f"--tree {tree} has no {', '.join(missing)}, which {what} touches; nothing in "
            "patches/ was changed",
            cause="--tree points at the wrong directory, or at a tree holding only some of the "
            "files (the patch would delete the others)",
            next="pass a tree that holds every file of the patch as edited (repository-root "
            "layout: torch/..., test/...) and rerun refresh",
        )


def _take_from_tree(repo: Path, *, tree: Path, files: list[str]) -> None:
    for rel in files:
        _write(repo, rel, (tree / rel).read_bytes())
    _git(repo, "add", "-A", "--", *files)
    if not _git(repo, "diff", "--cached", "--name-only").stdout.strip():
        raise _no_edits(tree, files)


def _no_edits(tree: Path, files) -> OverlayError:
    return OverlayError(
        f"{', '.join(files)} in {tree} are identical to pristine + earlier patches; "
        "nothing in patches/ was changed",
        cause="the edits were made elsewhere, or --tree points at the wrong directory "
        "(e.g. a stock install)",
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
    shutil.rmtree(out, ignore_errors=True)
    cp = _git(repo, "format-patch", "--zero-commit", "--no-signature", "-N",
               "--filename-max-length=200", "-1", "HEAD", "-o", str(out))
    path = Path(cp.stdout.strip().splitlines()[-1])
    return path.name, read_patch_text(path)


def _diff_part(text: str) -> str:
    i = text.find("\ndiff --git ")
    return text[i:] if i >= 0 else text


def _check_later(repo: Path, *, series: Series, later: list[str]) -> None:
    if later:
        patch_tree(root=repo, series=_sub_series(series, later), include_tests=True)


def _series_text(old: str | None, lines_edit) -> str:
    lines = old.splitlines() if old is not None else [
        "# Patches in apply order (quilt style; '#' starts a comment).",
        "# Written by `python -m torch_fork_overlay refresh`; regenerate, do not hand-edit patches.",
    ]
    return "\n".join(lines_edit(lines)) + "\n"


def _root(patches_dir) -> Path:
    return Path(patches_dir) if patches_dir is not None else default_patches_dir()


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One refresh at a time per patches folder."""
    what = f"the patch series in {root}"

    def unwritable(e: OSError) -> OverlayError:
        return OverlayError(
            f"cannot write to {root} ({e.strerror}) to refresh {what}",
            cause="the patches folder is read-only or owned by another user",
            next="run refresh in a checkout you own (or pass --patches-dir DIR)",
        )

    if not root.is_dir():
        try:
            root.mkdir(parents=True)
        except OSError as e:
            raise unwritable(e) from None
    with lock.exclusive(root / st.LOCK_NAME, what=what, out=print, unwritable=unwritable):
        yield


@contextlib.contextmanager
def _nothing_changed_on_error(target: Path) -> Iterator[None]:
    try:
        yield
    except OverlayError as e:
        if "nothing in patches/ was changed" not in e.what and f"nothing in {target}" not in e.what:
            e.what += f"\n  (refresh works on a scratch copy of the series: nothing in {target} was changed)"
        raise


class _Candidate:
    """A copy of ``patches/v<version>/`` in which refresh makes its changes;
    ``commit`` checks it as a whole and only then moves the changed files in."""

    def __init__(self, tmp: Path, *, root: Path, version: str) -> None:
        self.version = version
        self.target = root / f"v{version}"
        self.root = tmp / "candidate"
        self.dir = self.root / self.target.name
        self.dir.mkdir(parents=True)
        if self.target.is_dir():
            for p in self.target.iterdir():
                if p.is_file() and not p.name.startswith("."):
                    shutil.copyfile(p, self.dir / p.name)
        self.changed: dict[str, bytes | None] = {}

    def read(self, name: str) -> str | None:
        p = self.dir / name
        return read_patch_text(p, what="file") if p.is_file() else None

    def write(self, name: str, text: str) -> None:
        (self.dir / name).write_text(text, encoding="utf-8")
        self.changed[name] = text.encode("utf-8")

    def delete(self, name: str) -> None:
        (self.dir / name).unlink()
        self.changed[name] = None

    def series(self, *, require_manifest: bool = False) -> Series:
        return load_series(self.version, patches_dir=self.root, require_manifest=require_manifest)

    def commit(self, pristine: Pristine) -> Path:
        """Check that the whole candidate series loads, applies to pristine
        files (tests included) and matches its rewritten manifest; then move
        the changed files into ``patches/`` (nothing there changes before)."""
        series = self.series()
        if not series.patches:
            raise OverlayError(f"the candidate series for torch {self.version} has no patches",
                               cause="every patch was removed", next="keep at least one patch")
        with tempfile.TemporaryDirectory(prefix="tfo-check-series-") as tmp:
            tmp = Path(tmp)
            for rel in sorted({f for p in series.patches for f in p.files}):
                _write(tmp, rel, pristine.read(rel))
            patch_tree(root=tmp, series=series, include_tests=True)
        mpath = write_manifest(self.dir, version=self.version, files=_manifest_for(series, pristine))
        self.changed[MANIFEST] = mpath.read_bytes()
        self.series(require_manifest=True)
        self.target.mkdir(parents=True, exist_ok=True)
        # new patches first, then manifest and series, deletions last
        order = sorted(self.changed, key=lambda n: (self.changed[n] is None, n == SERIES, n == MANIFEST))
        for name in order:
            data, dest = self.changed[name], self.target / name
            if data is None:
                jn.unlink(dest)
            elif not dest.is_file() or dest.read_bytes() != data:
                jn.write_file(dest, data)
        return self.target / MANIFEST


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
    root = _root(patches_dir)
    for f in files:
        check_relpath(f, where="--files")
    _check_tree(Path(tree), files, what="the new patch")
    if name is not None:
        check_relpath(name, where="--name")
    with _locked(root), _nothing_changed_on_error(root / f"v{version}"), \
            tempfile.TemporaryDirectory(prefix="tfo-refresh-") as tmp:
        cand = _Candidate(Path(tmp), root=root, version=version)
        if cand.read(SERIES) is None:
            cand.write(SERIES, _series_text(None, lambda lines: lines))
        series = cand.series()
        names = [p.name for p in series.patches]
        if replace is not None and replace not in names:
            raise OverlayError(
                f"--replace {replace}: no such patch in {cand.target / SERIES}",
                cause="the name is mistyped", next=f"cat {cand.target / SERIES}")
        pos = names.index(replace) if replace else len(names)
        before, later = names[:pos], names[pos + 1 if replace else pos:]
        work = Path(tmp) / "work"
        work.mkdir()
        repo = _base_repo(work, series=series, pristine=pristine, extra=files, before=before)
        _take_from_tree(repo, tree=Path(tree), files=files)
        _git(repo, "commit", "-q", "-F", str(Path(message_file).resolve()))
        _trailers(repo, version=series.version)
        fp_name, text = _format_patch(repo)
        _check_later(repo, series=series, later=later)
        name = name or f"{pos + 1:04d}-{fp_name.split('-', 1)[1]}"
        check_relpath(name, where="--name")
        cand.write(name, text)

        def edit(lines: list[str]) -> list[str]:
            if replace:
                return [name if l.split("#", 1)[0].strip().split()[:1] == [replace] else l for l in lines]
            return lines + [name]

        cand.write(SERIES, _series_text(cand.read(SERIES), edit))
        if replace and replace != name:
            cand.delete(replace)
        cand.commit(pristine)
    sdir = root / f"v{version}"
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
    root = _root(patches_dir)
    with _locked(root), _nothing_changed_on_error(root / f"v{version}"), \
            tempfile.TemporaryDirectory(prefix="tfo-refresh-") as tmp:
        cand = _Candidate(Path(tmp), root=root, version=version)
        series = cand.series()
        names = [p.name for p in series.patches]
        if patch not in names:
            raise OverlayError(f"no patch {patch} in {cand.target / SERIES}",
                               cause="the name is mistyped", next=f"cat {cand.target / SERIES}")
        pos = names.index(patch)
        old = series.patches[pos]
        _check_tree(Path(tree), old.files, what=patch)
        work = Path(tmp) / "work"
        work.mkdir()
        repo = _base_repo(work, series=series, pristine=pristine, extra=[], before=names[:pos])
        # git am keeps the message, author and date of the existing patch
        _git(repo, "am", "-q", "--keep-cr", str(old.path.resolve()),
             what=f"{patch} does not apply to pristine + earlier patches",
             cause="an earlier patch changed under it",
             next="regenerate the earlier patches first, in series order")
        for rel in old.files:
            _write(repo, rel, (Path(tree) / rel).read_bytes())
        _git(repo, "add", "-A", "--", *old.files)
        _git(repo, "commit", "-q", "--amend", "--allow-empty", "--no-edit")
        if not _git(repo, "diff", "--name-only", "HEAD~1", "HEAD").stdout.strip():
            raise _no_edits(Path(tree), old.files)
        _, text = _format_patch(repo)
        old_text = cand.read(patch)
        unchanged = _diff_part(text) == _diff_part(old_text)
        if not unchanged:
            _trailers(repo, version=series.version)
            _, text = _format_patch(repo)
            _check_later(repo, series=series, later=names[pos + 1:])
            cand.write(patch, text)
        cand.commit(pristine)
    dest = cand.target / patch
    if unchanged:
        print(f"{dest}: unchanged")
    else:
        print(f"regenerated {dest} and rewrote {cand.target / 'manifest.json'}")
    return dest


def _manifest_for(series: Series, pristine: Pristine) -> dict[str, dict[str, str | None]]:
    """sha256 of every touched non-test file, pristine and after the series."""
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
                raise OverlayError(f"the v{series.version} series deletes {rel}",
                                   cause="deleting files from an install is not supported",
                                   next="change the patch to edit the file instead")
            manifest[rel]["patched"] = h
    return manifest


def write_series_manifest(
    *, version: str, pristine: Pristine, patches_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Rewrite ``manifest.json`` from pristine files + the whole series."""
    root = _root(patches_dir)
    with _locked(root), _nothing_changed_on_error(root / f"v{version}"), \
            tempfile.TemporaryDirectory(prefix="tfo-refresh-") as tmp:
        cand = _Candidate(Path(tmp), root=root, version=version)
        cand.series()  # a missing series is refused here, before anything is written
        return cand.commit(pristine)
