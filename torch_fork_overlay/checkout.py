"""Checks on a PyTorch source checkout, shared by ``export`` and ``source-build``.

A checkout claims a release through three pieces of evidence, strongest last:

* ``version.txt`` at the repository root: ``2.15.0a0`` on the ``v2.15.0``
  tag (release branches keep the ``a0``; the wheel's version comes from
  ``PYTORCH_BUILD_VERSION``), ``2.16.0a0`` on ``main`` after the branch cut;
* the git tag ``v2.15.0``, when the clone has tags;
* the sha256 of every file the series touches, compared with the series
  manifest: pristine (the patch will apply as written), patched (already
  applied), or neither (someone else's edit, or another release).

Nothing here changes the checkout.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

from packaging.version import InvalidVersion, Version

from . import proc
from .errors import OverlayError
from .series import Series


@dataclasses.dataclass(frozen=True)
class CheckoutVersion:
    raw: str  # "2.15.0a0"
    base: str  # "2.15.0"
    is_prerelease: bool


def require_source_dir(src: str | os.PathLike[str], *, command: str) -> Path:
    path = Path(src).resolve()
    if not path.is_dir():
        raise OverlayError(
            f"--pytorch-src {src} is not a directory",
            cause="the path was mistyped or the checkout has not been cloned yet",
            next="git clone --recursive https://github.com/pytorch/pytorch && "
            f"python -m torch_fork_overlay {command} --pytorch-src pytorch",
        )
    if not (path / "torch").is_dir() or not (path / "version.txt").is_file():
        raise OverlayError(
            f"{path} is not a PyTorch source checkout (no torch/ and version.txt at its top)",
            cause="--pytorch-src must name the repository root, not an installed torch or a subfolder",
            next=f"python -m torch_fork_overlay {command} --pytorch-src <the folder holding setup.py and version.txt>",
        )
    return path


def read_version(src: Path) -> CheckoutVersion:
    raw = (src / "version.txt").read_text(encoding="utf-8").strip()
    try:
        v = Version(raw)
    except InvalidVersion:
        raise OverlayError(
            f"{src / 'version.txt'} holds {raw!r}, which is not a version",
            cause="the file was edited or the checkout is damaged",
            next=f"see what changed: git -C {src} diff -- version.txt; it must hold the checkout's release, "
            "e.g. 2.15.0",
        ) from None
    return CheckoutVersion(raw=raw, base=v.base_version, is_prerelease=v.is_prerelease)


def sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def manifest_states(src: Path, series: Series) -> dict[str, str]:
    """{relpath: "pristine" | "patched" | "modified" | "missing"} per manifest file."""
    out = {}
    for rel, hashes in sorted(series.manifest.items()):
        h = sha256(src / rel)
        if h is not None and h == hashes.get("patched"):
            out[rel] = "patched"
        elif h == hashes.get("pristine"):  # None == None: a file the series creates
            out[rel] = "pristine"
        elif h is None:
            out[rel] = "missing"
        else:
            out[rel] = "modified"
    return out


def require_matching_files(src: Path, series: Series, *, allow_patched: bool, command: str) -> str:
    """Raise unless every touched file is pristine (or, if allowed, all patched).

    Returns ``"pristine"`` or ``"patched"``.
    """
    states = manifest_states(src, series)
    values = set(states.values())
    if values <= {"pristine"}:
        return "pristine"
    if allow_patched and values == {"patched"}:
        return "patched"
    bad = [f"{rel} ({st})" for rel, st in states.items() if st not in ("pristine",)]
    raise OverlayError(
        f"{src} does not match the pristine torch {series.version} files the "
        f"v{series.version} series patches: {', '.join(bad)}",
        cause="the checkout is another release or commit, or those files were edited "
        "(the series manifest records their sha256 in the v"
        f"{series.version} release)",
        next=f"git -C {src} status && git -C {src} checkout v{series.version}, "
        f"then rerun python -m torch_fork_overlay {command}",
    )


# --- git -------------------------------------------------------------------


def git(src: Path, *args: str, check: bool = True, **kw):
    return proc.run(["git", "-C", str(src), *args], check=check, **kw)


def require_git_checkout(src: Path, *, command: str) -> None:
    cp = git(src, "rev-parse", "--show-toplevel", check=False)
    if cp.returncode != 0:
        raise OverlayError(
            f"{src} is not a git checkout ({cp.stderr.strip().splitlines()[-1] if cp.stderr.strip() else 'git rev-parse failed'})",
            cause=f"{command} commits the series with git am, which needs a git clone of "
            "pytorch/pytorch (a source tarball or an installed torch will not do)",
            next=f"git clone https://github.com/pytorch/pytorch && git -C pytorch checkout v2.15.0 && "
            f"python -m torch_fork_overlay {command} --pytorch-src pytorch",
        )
    top = Path(cp.stdout.strip()).resolve()
    if top != src:
        raise OverlayError(
            f"{src} is inside the git repository {top}, not its top",
            cause="--pytorch-src must name the PyTorch repository root",
            next=f"python -m torch_fork_overlay {command} --pytorch-src {top}",
        )
    gitdir = Path(git(src, "rev-parse", "--absolute-git-dir").stdout.strip())
    for name in ("rebase-apply", "rebase-merge", "MERGE_HEAD", "CHERRY_PICK_HEAD"):
        if (gitdir / name).exists():
            raise OverlayError(
                f"{src} has a git operation in progress ({gitdir / name} exists)",
                cause="an earlier git am, rebase, merge or cherry-pick was not finished",
                next=f"git -C {src} status, then finish it or run git -C {src} am --abort "
                "(or rebase/merge --abort)",
            )


def dirty_paths(src: Path) -> tuple[list[str], list[str]]:
    """(changed tracked paths, untracked paths), as ``git status`` shows them."""
    out = git(src, "status", "--porcelain=v1", "-z", "--untracked-files=all").stdout
    tracked, untracked = [], []
    entries = out.split("\0")
    i = 0
    while i < len(entries):
        e = entries[i]
        i += 1
        if not e:
            continue
        code, path = e[:2], e[3:]
        if code == "??":
            untracked.append(path)
        else:
            tracked.append(path)
            if code[0] in "RC":  # the rename source follows
                i += 1
    return tracked, untracked


def head(src: Path) -> tuple[str, str | None]:
    """(commit sha, branch name or None when detached)."""
    sha = git(src, "rev-parse", "HEAD").stdout.strip()
    cp = git(src, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    return sha, (cp.stdout.strip() if cp.returncode == 0 else None)


def tag_commit(src: Path, tag: str) -> str | None:
    cp = git(src, "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}", check=False)
    return cp.stdout.strip() if cp.returncode == 0 else None


def branch_exists(src: Path, name: str) -> bool:
    return git(src, "rev-parse", "--verify", "--quiet", f"refs/heads/{name}", check=False).returncode == 0
