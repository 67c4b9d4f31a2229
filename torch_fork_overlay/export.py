"""``export``: commit the series onto a PyTorch checkout as an upstream PR.

Each patch is already a ``git format-patch`` file whose message is the PR
text (problem, fix, alternatives considered, test plan).  Export checks the
checkout (a git repository at its top, no operation in progress, a clean
tree, HEAD at the base it claims, the touched files pristine), creates a
branch, and runs ``git am --3way`` on a filtered copy of each patch:

* project-only trailers (``Applies-To:``, ``Forwarded:``, ``Last-Update:``)
  are removed from the message;
* a message without a ``Test Plan:`` gets one listing the exact commands that
  run the series' upstream test files;
* ``Fixes #...`` lines are kept as written and never invented;
* the author becomes the person exporting (who signs PyTorch's CLA), unless
  ``--keep-author``.

It prints the next commands (review, test, ``ghstack`` or ``git push``) and
runs none of them.  On any failure the branch is deleted and HEAD restored.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from pathlib import Path
from typing import Callable

from packaging.version import Version

from . import checkout as co
from .errors import OverlayError
from .releases import file_hasher, find_serving
from .series import Patch, Series, load_series, own_release, patches_root, supported_versions

#: Trailers that only mean something inside this project (DEP-3 style).
PROJECT_TRAILERS = ("Applies-To", "Forwarded", "Last-Update")

_TRAILER = re.compile(r"^([A-Za-z0-9][A-Za-z0-9-]*)\s*:\s")


@dataclasses.dataclass(frozen=True)
class ExportResult:
    src: Path
    branch: str
    base: str  # "v2.15.0" or "main"
    base_commit: str
    commits: list[str]  # "<short sha> <subject>", oldest first
    next_commands: list[str]


# --- commit message filtering ------------------------------------------------


def split_patch(text: str) -> tuple[list[str], list[str], list[str]]:
    """Split a format-patch mail into (header lines, body lines, rest from '---')."""
    lines = text.split("\n")
    try:
        blank = lines.index("")
    except ValueError:
        raise OverlayError(
            "patch has no blank line between its mail headers and its message",
            cause="it is not a git format-patch file",
            next="regenerate it with: python -m torch_fork_overlay refresh --help",
        ) from None
    headers, rest = lines[:blank], lines[blank + 1 :]
    try:
        sep = rest.index("---")
    except ValueError:
        sep = next((i for i, l in enumerate(rest) if l.startswith("diff --git ")), len(rest))
    return headers, rest[:sep], rest[sep:]


def _paragraphs_end(body: list[str]) -> int:
    n = len(body)
    while n and not body[n - 1].strip():
        n -= 1
    return n


def strip_project_trailers(body: list[str], names=PROJECT_TRAILERS) -> list[str]:
    """Remove ``names`` from the trailer block (the last paragraph) of ``body``."""
    end = _paragraphs_end(body)
    start = end
    while start and body[start - 1].strip():
        start -= 1
    block = body[start:end]
    if not block or not all(_TRAILER.match(l) or l[:1].isspace() for l in block):
        return body[:end]  # the last paragraph is prose, not trailers
    wanted = {n.lower() for n in names}
    kept: list[str] = []
    dropping = False
    for line in block:
        if line[:1].isspace():  # continuation of the previous trailer
            if not dropping:
                kept.append(line)
            continue
        dropping = _TRAILER.match(line).group(1).lower() in wanted
        if not dropping:
            kept.append(line)
    head = body[:start]
    if not kept:
        return head[: _paragraphs_end(head)]
    return head + kept


def test_plan_commands(series: Series) -> list[str]:
    files = sorted({f for p in series.patches if p.is_test for f in p.files if f.endswith(".py")})
    return [f"python {f}" for f in files]


def add_test_plan(body: list[str], commands: list[str]) -> list[str]:
    if any(re.match(r"^\s*#*\s*Test Plan\b", l, re.I) for l in body) or not commands:
        return body
    end = _paragraphs_end(body)
    start = end
    while start and body[start - 1].strip():
        start -= 1
    block = body[start:end]
    has_trailers = bool(block) and all(_TRAILER.match(l) or l[:1].isspace() for l in block)
    plan = ["Test Plan:", *(f"    {c}" for c in commands), ""]
    if has_trailers:
        return body[:start] + plan + block
    return body[:end] + ([""] if end else []) + plan[:-1]


def set_author(headers: list[str], author: str) -> list[str]:
    """Replace the mail's ``From:`` header (and its folded lines) with ``author``."""
    out: list[str] = []
    skipping = False
    for line in headers:
        if line.startswith("From: "):
            out.append(f"From: {author}")
            skipping = True
        elif skipping and line[:1] in (" ", "\t"):
            continue
        else:
            skipping = False
            out.append(line)
    return out


def filter_patch(text: str, *, test_plan: list[str], author: str | None = None) -> str:
    headers, body, rest = split_patch(text)
    if author:
        headers = set_author(headers, author)
    body = add_test_plan(strip_project_trailers(body), test_plan)
    return "\n".join(headers + [""] + body + [""] + rest)


# --- the export ----------------------------------------------------------------


def _resolve_base(base: str | None, patches_dir) -> tuple[str, Series | None]:
    """(base, its series); the series is None for a release without a folder
    of its own, which only the checkout's files can match (``_serving_base``)."""
    if base is None:  # the newest release (a folder with a local label is no tag)
        plain = [v for v in supported_versions(patches_dir) if "+" not in v]
        base = f"v{plain[-1]}" if plain else "v0"
    if base == "main":
        supported = supported_versions(patches_dir)
        if not supported:
            load_series("0", patches_dir=patches_dir)  # raises the "no series" error
        return "main", load_series(supported[-1], patches_dir=patches_dir)
    if not re.fullmatch(r"v?\d+(\.\d+)*\S*", base):
        raise OverlayError(
            f"--base {base} is neither a release tag nor main",
            cause="--base takes a release tag such as v2.15.0 (a supported series), or main",
            next="python -m torch_fork_overlay export --pytorch-src DIR --base v2.15.0",
        )
    version = base[1:] if base.startswith("v") else base
    if own_release(version, patches_dir) is None and supported_versions(patches_dir):
        if Version(version).base_version != version:
            raise OverlayError(
                f"--base {base} is not a release tag",
                cause="--base takes a release tag such as v2.15.0, or main",
                next=f"python -m torch_fork_overlay export --base v{supported_versions(patches_dir)[-1]} ...",
            )
        return f"v{version}", None
    series = load_series(version, patches_dir=patches_dir)
    if Version(version).base_version != version:
        raise OverlayError(
            f"--base {base} is not a release tag",
            cause="--base takes a release tag such as v2.15.0, or main",
            next=f"python -m torch_fork_overlay export --base v{series.version} ...",
        )
    return f"v{series.version}", series


def _serving_base(src: Path, base: str, patches_dir) -> Series:
    """The series for a release tag without a folder of its own: the one whose
    manifest finds the checkout's touched files byte-identical (``releases``).
    The checkout must be that release, or its files would say nothing about it."""
    version = base[1:]
    v = co.read_version(src)
    supported = supported_versions(patches_dir)
    if v.base != version:
        raise OverlayError(
            f"no patch series for torch {version} in {patches_root(patches_dir)}: there is no {base}/, "
            f"and {src} is torch {v.raw} (version.txt), not {version}, so its files cannot show "
            f"which series would serve {version}",
            cause=f"this project supports torch {', '.join(supported)}; a release without a folder is "
            "served by a series only when the files that series touches are byte-identical in it, "
            "which export checks on a checkout of that release",
            next=f"git -C {src} checkout {base} (git -C {src} fetch --tags first if the tag is missing), "
            f"then rerun; or export a supported release: --base v{supported[-1]}",
        )
    serving = find_serving(
        version, hash_of=file_hasher(src), what=f"{src}, torch {v.raw} (version.txt, --base {base})",
        patches_dir=patches_dir,
        next=f"export a supported release instead: git -C {src} checkout v{supported[-1]}, then "
        f"python -m torch_fork_overlay export --pytorch-src {src} --base v{supported[-1]}",
    )
    return serving.series


def _check_base(src: Path, base: str, series: Series, sha: str) -> None:
    v = co.read_version(src)
    cmd = f"python -m torch_fork_overlay export --pytorch-src {src}"
    if base == "main":
        if not (v.is_prerelease and Version(v.base) > Version(series.version)):
            raise OverlayError(
                f"{src} is torch {v.raw} (version.txt), not main: --base main expects a "
                f"development version newer than {series.version}",
                cause="the checkout is a release tag or branch",
                next=f"git -C {src} fetch origin && git -C {src} checkout origin/main, or {cmd} --base v{v.base}",
            )
        return
    if v.base != base[1:]:
        raise OverlayError(
            f"{src} is torch {v.raw} (version.txt), not the {base} it is exported onto",
            cause=f"the checkout is another release; the series in this project is made for {series.version}",
            next=f"git -C {src} checkout {base} (git -C {src} fetch --tags first if the tag is missing), "
            f"then {cmd} --base {base}",
        )
    state = co.manifest_states(src, series)
    if state and set(state.values()) == {"patched"}:
        raise OverlayError(
            f"the v{series.version} series is already committed at HEAD {sha[:12]} of {src}",
            cause="an earlier export (or a manual git am) already applied it",
            next=f"git -C {src} log --oneline {base}..HEAD to see it, or git -C {src} checkout {base} and rerun",
        )
    tagged = co.tag_commit(src, base)
    if tagged is not None and tagged != sha:
        raise OverlayError(
            f"HEAD of {src} is {sha[:12]}, not the {base} tag ({tagged[:12]})",
            cause="the checkout has moved past the release (or is another commit on its branch)",
            next=f"git -C {src} checkout {base}, then {cmd} --base {base}",
        )
    co.require_matching_files(src, series, allow_patched=False, command="export")


def export(
    *,
    pytorch_src: str | os.PathLike[str],
    base: str | None = None,
    branch: str | None = None,
    keep_author: bool = False,
    patches_dir: str | os.PathLike[str] | None = None,
    echo: Callable[[str], None] = print,
) -> ExportResult:
    """Check ``pytorch_src`` and commit the series onto a new branch there.

    ``base`` is ``v<release>`` (default: the newest supported release) or
    ``main``.  A release without a folder of its own is exported with the
    series that serves it, decided by the checkout's files (``releases``).

    The commits are authored by the person exporting (git's author identity in
    the checkout), who submits the PR and signs PyTorch's CLA; ``keep_author``
    keeps the authors recorded in the patch files instead.
    """
    src = co.require_source_dir(pytorch_src, command="export")
    co.require_git_checkout(src, command="export")
    base, series = _resolve_base(base, patches_dir)
    branch = branch or f"torch-fork-overlay/fakemode-{base}"

    tracked, untracked = co.dirty_paths(src)
    if tracked:
        raise OverlayError(
            f"{src} has uncommitted changes: {', '.join(tracked[:5])}"
            + (f" and {len(tracked) - 5} more" if len(tracked) > 5 else ""),
            cause="export needs a clean tree so the branch holds only the series",
            next=f"git -C {src} stash (or commit them elsewhere), then rerun",
        )
    if series is None:
        series = _serving_base(src, base, patches_dir)
    touched = {f for p in series.patches for f in p.files}
    clash = sorted(set(untracked) & touched)
    if clash:
        raise OverlayError(
            f"{src} has untracked files the series would create: {', '.join(clash)}",
            cause="an earlier apply or a copy of the tests left them behind",
            next=f"see them: git -C {src} status --short; move them out of the checkout (or commit them on "
            "another branch), then rerun",
        )
    sha, orig_branch = co.head(src)
    _check_base(src, base, series, sha)
    if co.branch_exists(src, branch):
        raise OverlayError(
            f"branch {branch} already exists in {src}",
            cause="an earlier export made it",
            next=f"pass --branch <another name> (what {branch} holds: git -C {src} log --oneline -3 {branch})",
        )
    ident = co.git(src, "var", "GIT_AUTHOR_IDENT", check=False)
    if ident.returncode != 0 or co.git(src, "var", "GIT_COMMITTER_IDENT", check=False).returncode != 0:
        raise OverlayError(
            f"git in {src} has no author/committer identity",
            cause="user.name / user.email are not configured",
            next='git config --global user.name "Your Name" && git config --global user.email you@example.com',
        )
    echo(
        f"export: {src} is {base} at {sha[:12]}; checked: git top level, no operation in "
        f"progress, clean tree, base, {len(series.manifest)} touched file(s) pristine"
    )

    author = None if keep_author else ident.stdout.strip().rsplit(" ", 2)[0]  # drop "<time> <tz>"
    plan = test_plan_commands(series)
    with tempfile.TemporaryDirectory(prefix="tfo-export-") as tmp:
        mails = []
        for p in series.patches:
            out = Path(tmp) / p.name
            out.write_text(filter_patch(p.path.read_text(encoding="utf-8"), test_plan=plan, author=author), encoding="utf-8")
            mails.append(str(out))
        co.git(src, "checkout", "--quiet", "-b", branch)
        cp = co.git(src, "am", "--3way", "--quiet", *mails, check=False)
        if cp.returncode != 0:
            _undo(src, branch, sha, orig_branch)
            failed = _failed_patch(cp.stdout + cp.stderr, series.patches)
            raise OverlayError(
                f"git am of the v{series.version} series onto {base} ({sha[:12]}) failed at {failed}\n"
                + "\n".join("    " + l for l in (cp.stdout + cp.stderr).strip().splitlines()[-12:]),
                cause=(
                    "main has moved and the series no longer applies; it needs rebasing"
                    if base == "main"
                    else "the checkout differs from pristine torch in a way the checks did not see"
                ),
                next=f"export onto the release instead (--base v{series.version}), or rebase the series: "
                "python -m torch_fork_overlay refresh --help" + f"; {src} was left as it was",
            )
    log = co.git(src, "log", "--reverse", "--format=%h %s", f"{sha}..{branch}").stdout.splitlines()
    back = orig_branch or sha[:12]
    nxt = [
        f"cd {src}",
        f"git log --stat {base if base != 'main' else sha[:12]}..{branch}   # review the commits",
        *[f"{c}   # the Test Plan" for c in plan],
        "# one PR per commit, as PyTorch prefers (https://github.com/ezyang/ghstack):",
        "pip install ghstack && ghstack submit",
        "# or one PR from your fork:",
        f"git push <your-fork-remote> {branch}   # then open a PR against pytorch/pytorch main",
        f"git checkout {back}   # to go back to where you were",
    ]
    if base != "main":
        nxt.insert(2, "git fetch origin && git rebase origin/main   # PRs target main; or rerun with --base main")
    echo(f"export: created branch {branch} with {len(log)} commit(s) on {base}:")
    for line in log:
        echo(f"  {line}")
    echo("Next (none of these were run):")
    for c in nxt:
        echo(f"  {c}")
    return ExportResult(src=src, branch=branch, base=base, base_commit=sha, commits=log, next_commands=nxt)


def _failed_patch(output: str, patches: list[Patch]) -> str:
    m = re.search(r"Patch failed at (\d+) (.*)", output)
    if not m:
        return "one of its patches"
    i = int(m.group(1))
    name = patches[i - 1].name if 0 < i <= len(patches) else m.group(2).strip()
    return f"{name} (patch {i} of {len(patches)})"


def _undo(src: Path, branch: str, sha: str, orig_branch: str | None) -> None:
    co.git(src, "am", "--abort", check=False)
    co.git(src, "reset", "--quiet", "--hard", sha, check=False)
    if orig_branch:
        co.git(src, "checkout", "--quiet", orig_branch)
    else:
        co.git(src, "checkout", "--quiet", "--detach", sha)
    co.git(src, "branch", "-D", branch, check=False)
