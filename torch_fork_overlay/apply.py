"""The one apply implementation: a series onto a tree, and onto an install.

``patch_tree`` applies a series to any directory laid out like the PyTorch
repository root (a staging copy, an unpacked wheel, site-packages, a
checkout).  ``apply_to_install`` / ``revert_install`` wrap it with what an
install needs:

0. the install's lock (``lock``): one apply / revert at a time; a run that
   finds the journal of an interrupted one first rolls it back (``journal``);
1. every precondition is checked first: a series for this release, every
   touched file pristine per the manifest, every target directory and file
   writable (by trying: ``os.access`` is meaningless as root), enough space;
2. every patched file is produced in a staging copy and its hash checked
   against the manifest;
3. only then is the install changed, through the journal (``journal``): each
   file replaced atomically and durably; on an error everything is rolled
   back, and after a kill the next run finishes the roll-back.

Revert restores from the byte-identical backup taken at apply time rather
than reverse-applying the series: the patches in the checkout may have
changed since (e.g. the placeholder was replaced by the real patch), and a
backup still restores exactly what pip installed.  Both the backup and the
restored file are hash-checked against the state file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from . import journal as jn
from . import lock
from . import state as st
from .errors import OverlayError
from .locate import TorchInstall, locate
from .proc import run
from .releases import NONE, Serving, file_hasher, find_serving
from .series import Series

Printer = Callable[[str], None]


def _git_apply_env(root: Path) -> dict[str, str]:
    # Never let git discover a repository above ``root`` (which would make it
    # silently skip paths outside the current directory).
    return {"GIT_CEILING_DIRECTORIES": str(Path(root).resolve().parent)}


def patch_tree(*, root: str | os.PathLike[str], series: Series, include_tests: bool) -> list[str]:
    """Apply ``series`` in order to the tree at ``root`` with ``git apply -p1``.

    Patches whose paths are all under ``test/`` are skipped unless
    ``include_tests``; paths under ``test/`` in mixed patches likewise.
    Each patch applies fully or not at all, but a failure in patch N leaves
    patches 1..N-1 applied: callers that need atomicity apply to a staging
    copy (as ``apply_to_install`` and ``wheel.build_wheel`` do).
    Returns the names of the patches applied.
    """
    root = Path(root)
    applied = []
    patches = series.patches if include_tests else series.install_patches()
    for i, patch in enumerate(patches, 1):
        cmd = ["git", "apply", "-p1", "--whitespace=nowarn"]
        if not include_tests:
            cmd.append("--exclude=test/*")
        cmd.append(str(patch.path.resolve()))
        cp = run(cmd, cwd=root, env=_git_apply_env(root), check=False)
        if cp.returncode != 0:
            tail = "\n".join("    " + l for l in cp.stderr.strip().splitlines()[-10:])
            if "No space left on device" in cp.stderr:
                raise OverlayError(
                    f"git apply could not write the patched files of {patch.name} under {root}: "
                    "No space left on device",
                    cause=f"the disk holding {root} is full",
                    next="free some space there (or, for a staging copy, point TMPDIR at another "
                    "disk) and rerun the same command",
                )
            raise OverlayError(
                f"patch {patch.name} ({i} of {len(patches)} in {series.dir / 'series'}) "
                f"does not apply to {', '.join(patch.files)} under {root}"
                + (f"; patches {', '.join(applied)} applied before it" if applied else "")
                + (f"\n{tail}" if tail else ""),
                cause=f"the files are not torch {series.version} plus the earlier patches "
                "of the series, or the patch was generated against another base",
                next="regenerate the patch from an edited tree: "
                "python -m torch_fork_overlay refresh --help",
            )
        applied.append(patch.name)
    return applied


def check_writable(paths: list[Path], *, what: str) -> None:
    """Prove each directory (and existing file) can be changed by trying.
    The probe is an unnamed temp file (O_TMPFILE where the OS has it), so a
    kill at any moment leaves nothing behind. A file to be created in a
    directory that does not exist yet is checked in the nearest directory that
    does: the one the new directory will be made in."""
    dirs = sorted({_nearest_existing_dir(p) for p in paths})
    for d in dirs:
        try:
            with tempfile.TemporaryFile(prefix=".tfo-check-", dir=d):
                pass
        except OSError as e:
            raise _readonly(d, e, what) from None
    for p in paths:
        if p.is_file():
            try:
                with open(p, "ab"):
                    pass
            except OSError as e:
                raise _readonly(p, e, what) from None


def _nearest_existing_dir(path: Path) -> Path:
    d = path if path.is_dir() else path.parent
    while not d.is_dir() and d != d.parent:
        d = d.parent
    return d


def _readonly(path: Path, e: OSError, what: str) -> OverlayError:
    return OverlayError(
        f"cannot write to {path} ({e.strerror}) while patching {what}; nothing was changed",
        cause="the install is read-only: a system or shared site-packages, an immutable "
        "directory, a read-only mount, or owned by another user",
        next="rerun as the owner of that environment, or install a patched wheel into "
        f"your own venv: python -m torch_fork_overlay wheel --version {_release_of(what)}",
    )


def _release_of(what: str) -> str:
    """``torch 2.15.0+cu132 at DIR`` -> ``2.15.0`` (for the next command of an error)."""
    parts = what.split()
    return parts[1].split("+")[0] if len(parts) > 1 and parts[0] == "torch" else "<release>"


def _check_space(where: Path, need: int, *, what: str) -> None:
    try:
        sv = os.statvfs(where)
    except OSError:
        return
    free = sv.f_bavail * sv.f_frsize
    if free < need:
        raise OverlayError(
            f"not enough free space to patch {what}: {need} bytes needed in {where}, "
            f"{free} free; nothing was changed",
            cause="the disk is full",
            next="free some space there and rerun the same command",
        )


def _describe(inst: TorchInstall) -> str:
    return f"torch {inst.version} at {inst.torch_dir}"


def _target_args(inst: TorchInstall) -> str:
    return f"--site-packages {inst.site_packages}"


@contextlib.contextmanager
def install_lock(inst: TorchInstall, *, out: Printer) -> Iterator[None]:
    """The install's lock (``lock``): a second apply / revert waits, then refuses."""
    what = _describe(inst)
    with lock.exclusive(inst.site_packages / st.LOCK_NAME, what=what, out=out,
                        unwritable=lambda e: _readonly(inst.site_packages, e, what)):
        yield


def _targets(inst: TorchInstall, rels) -> list[Path]:
    out = [inst.site_packages / r for r in rels] + [inst.torch_dir, inst.site_packages]
    if (inst.torch_dir / st.BACKUP_DIR).is_dir():
        out.append(inst.torch_dir / st.BACKUP_DIR)
    if inst.record:
        out.append(inst.record)
    return out


def _recover(inst: TorchInstall, *, rels: list[str], out: Printer) -> jn.Plan | None:
    """Under the lock: roll back an interrupted run (its journal is on disk),
    else remove the leftovers of a run killed before it wrote its journal."""
    plan = jn.read_journal(inst)
    if plan is None:
        found = jn.tidy(inst, rels)
        if found:
            out(f"removed {len(found)} leftover temp file(s) of an interrupted run: "
                + ", ".join(str(p) for p in found))
        return None
    out(f"found the journal of an interrupted {plan.op} ({plan.journal}): rolling it back to pristine")
    actions = jn.check_roll_back(plan, what=f"roll back the interrupted {plan.op} of")
    check_writable(_targets(inst, plan.files), what=_describe(inst))
    try:
        jn.roll_back(plan, actions)
    except OSError as e:
        raise _stopped(inst, plan, e) from e
    return plan


def _stopped(inst: TorchInstall, plan: jn.Plan, e: OSError) -> OverlayError:
    return OverlayError(
        f"rolling back {_describe(inst)} stopped at {e.filename} ({e.strerror}); the journal "
        f"{plan.journal} records what is left to do",
        cause="the file system refused a write: the disk is full, or it is read-only",
        next=f"fix that, then rerun: python -m torch_fork_overlay revert {_target_args(inst)}",
    )


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _classify(data: bytes | None, v: dict) -> str:
    h = st.sha256_bytes(data) if data is not None else None
    if h == v["patched"]:
        return st.PATCHED
    return st.PRISTINE if h == v["pristine"] else st.UNKNOWN


def apply_to_install(
    *,
    python: str | None = None,
    site_packages: str | os.PathLike[str] | None = None,
    patches_dir: str | os.PathLike[str] | None = None,
    out: Printer = print,
) -> str:
    """Apply the matching series to an installed torch. Returns a summary.

    Idempotent: a torch whose files already match the patched hashes is
    reported as already applied and left alone.  An interrupted apply or
    revert (a journal on disk) is rolled back first, then the series applied.
    """
    inst = locate(python=python, site_packages=site_packages)
    serving = serving_of(inst, patches_dir=patches_dir)
    series = serving.series
    if not series.install_patches():
        raise OverlayError(
            f"the v{series.version} series in {series.dir} has no patch to apply to an install "
            f"({len(series.patches)} listed in {series.dir / 'series'}, all under test/)",
            cause="the series file is empty or lists only test patches",
            next="add the patches to the series: python -m torch_fork_overlay refresh --help",
        )
    with install_lock(inst, out=out):
        recovered = _recover(inst, rels=sorted(series.manifest), out=out)
        msg = _apply_locked(inst, series, out=out, serving=serving)
    if recovered is not None:
        msg = f"rolled back the interrupted {recovered.op}, then: {msg}"
    return msg


def serving_of(inst: TorchInstall, *, patches_dir=None) -> Serving:
    """The series serving this install, by the hashes of its files (``releases``);
    the series its state file names is tried first."""
    try:
        state = st.read_state(inst.torch_dir, reinstall=inst.reinstall)
    except OverlayError:
        state = None  # reported by the locked run (apply / revert) or by status
    applied = str(state["series"]) if state and state.get("series") else None
    return find_serving(inst.version, hash_of=file_hasher(inst.site_packages), what=_describe(inst),
                        patches_dir=patches_dir, applied=applied)


def _apply_locked(inst: TorchInstall, series: Series, *, out: Printer, serving: Serving | None = None) -> str:
    sp, torch_dir, files = inst.site_packages, inst.torch_dir, series.manifest
    data = {rel: _read(sp / rel) for rel in files}  # read once: the bytes backed up are the bytes checked
    states = {rel: _classify(data[rel], v) for rel, v in files.items()}
    out(f"checked: torch {inst.version} (git {inst.git_version}) at {inst.torch_dir}; "
        f"series {series.dir}"
        + (f" (served by {serving.describe()})" if serving is not None and serving.match != NONE
           and not serving.own else "")
        + f"; {len(files)} file(s): "
        + ", ".join(f"{r} {s}" for r, s in sorted(states.items())))
    state = st.read_state(torch_dir, reinstall=inst.reinstall)
    if all(s == st.PATCHED for s in states.values()):
        if state is None:
            return _patched_without_state(inst, series, data)
        return f"already applied: {_describe(inst)} matches the v{series.version} series; nothing to do"
    bad = {r: s for r, s in states.items() if s != st.PRISTINE}
    if bad:
        raise _not_pristine(inst, series, bad, data, state=state)
    check_writable(_targets(inst, files), what=_describe(inst))

    try:
        with tempfile.TemporaryDirectory(prefix="tfo-stage-") as stage:
            stage = Path(stage)
            for rel, v in files.items():
                if v["pristine"] is not None:
                    (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                    (stage / rel).write_bytes(data[rel])
            try:
                applied = patch_tree(root=stage, series=series, include_tests=False)
            except OverlayError as e:
                e.what += f"\n  (applied to a staging copy; nothing in {inst.site_packages} was changed)"
                raise
            new = {rel: (stage / rel).read_bytes() for rel in files}
    except OSError as e:
        raise OverlayError(
            f"cannot prepare the patched files in a staging folder under {tempfile.gettempdir()} "
            f"({e.strerror}{': ' + str(e.filename) if e.filename else ''}); "
            f"nothing in {inst.site_packages} was changed",
            cause="the temp folder ($TMPDIR) is full or not writable",
            next="free some space there, or point TMPDIR at another folder: "
            f"TMPDIR=/path/to/tmp python -m torch_fork_overlay apply {_target_args(inst)}",
        ) from None
    for rel, blob in new.items():
        got = st.sha256_bytes(blob)
        if got != files[rel]["patched"]:
            raise OverlayError(
                f"the v{series.version} series produced {rel} with sha256 {got}, but "
                f"{series.dir / 'manifest.json'} expects {files[rel]['patched']}; nothing was changed",
                cause="the manifest is stale: a patch was regenerated without rewriting it",
                next=f"python -m torch_fork_overlay refresh --manifest-only --version {series.version}",
            )

    record_text = jn.read_record_text(inst)
    originals = st.record_lines_for(record_text, sorted(files)) if record_text is not None else {}
    plan_files: dict[str, dict] = {}
    for rel in sorted(files):
        b_rel = None
        if files[rel]["pristine"] is not None:
            b_rel = st.backup_path(torch_dir, rel).relative_to(sp).as_posix()
        plan_files[rel] = {"pristine": files[rel]["pristine"], "patched": files[rel]["patched"],
                           "backup": b_rel}
        if record_text is not None:
            plan_files[rel]["record_line"] = originals[rel]
    state_bytes = st.make_state(
        series_version=series.version, patches=applied, files=plan_files, site_packages=sp
    )
    modes = {rel: st.mode_of(sp / rel) for rel in files if data[rel] is not None}
    need = sum(len(b) for b in data.values() if b) + sum(map(len, new.values())) + len(state_bytes)
    need += 2 * len(record_text or "") + 8192 * (2 * len(files) + 4)
    _check_space(torch_dir, need, what=_describe(inst))
    plan = jn.Plan(op=jn.APPLY, inst=inst, series=series.version, patches=applied, files=plan_files)
    jn.commit_apply(plan, originals={r: d for r, d in data.items() if d is not None}, patched=new,
                    modes=modes, state_bytes=state_bytes, out=out)
    return (
        f"applied {len(applied)} patch(es) of the v{series.version} series to {_describe(inst)}: "
        f"{', '.join(applied)}\n  undo with: python -m torch_fork_overlay revert {_target_args(inst)}"
    )


def _patched_without_state(inst: TorchInstall, series: Series, data: dict[str, bytes | None]) -> str:
    """Every file patched, no state file: a patched wheel, or the remains of a
    killed run of an older version of this tool (RECORD then still lists the
    pristine hashes)."""
    text = jn.read_record_text(inst)
    if text is not None:
        lines = st.record_lines_for(text, sorted(data))
        stale = [r for r, d in sorted(data.items()) if d is not None and lines[r] != st.record_line(r, d)]
        if stale:
            raise OverlayError(
                f"{_describe(inst)} has the patched files of the v{series.version} series but no "
                f"{st.STATE_NAME}, and {inst.record} does not match {', '.join(stale)}",
                cause="a run of an older torch_fork_overlay (which had no journal) was killed after "
                "replacing the files and before recording it; no backup is known to be complete",
                next=f"reinstall pristine torch: {inst.reinstall}, then rerun: "
                f"python -m torch_fork_overlay apply {_target_args(inst)}",
            )
    return (f"already applied: {_describe(inst)} matches the v{series.version} series; nothing to do "
            f"(a patched build: there is no {st.STATE_NAME}, so undo it by reinstalling torch: "
            f"{inst.reinstall})")


def _not_pristine(inst: TorchInstall, series: Series, bad: dict[str, str],
                  data: dict[str, bytes | None], *, state: dict | None) -> OverlayError:
    sp = inst.site_packages
    text = jn.read_record_text(inst)
    lines = st.record_lines_for(text, sorted(bad)) if text is not None else {}
    as_installed = sorted(r for r, s in bad.items() if s == st.UNKNOWN and data[r] is not None
                          and lines.get(r) == st.record_line(r, data[r]))
    if as_installed and len(as_installed) == len(bad):
        return OverlayError(
            f"cannot apply the v{series.version} series to {_describe(inst)}: "
            + ", ".join(f"{sp / r}" for r in as_installed)
            + f" {'is' if len(as_installed) == 1 else 'are'} exactly as pip installed "
            f"{'it' if len(as_installed) == 1 else 'them'} (matching {inst.record}) but not the "
            f"pristine sha256 in {series.dir / 'manifest.json'}; nothing was changed",
            cause=f"the manifest does not describe this build of torch {inst.version} "
            f"(git {inst.git_version}): it is wrong, or the series was made from another build",
            next="rewrite the manifest from this install and review the diff: python -m "
            f"torch_fork_overlay refresh --manifest-only --version {series.version} --pristine {sp}",
        )
    if state is not None and all(s == st.PATCHED for s in bad.values()):
        return OverlayError(
            f"cannot apply the v{series.version} series to {_describe(inst)}: "
            + ", ".join(f"{sp / r}" for r in sorted(bad))
            + f" already {'has' if len(bad) == 1 else 'have'} the patched content but the other files "
            f"are pristine, and {st.state_path(inst.torch_dir)} records an earlier apply; nothing was changed",
            cause="an earlier apply (maybe of another version of the series) was partly undone by hand",
            next=f"undo it from its backups, then apply: python -m torch_fork_overlay revert "
            f"{_target_args(inst)} && python -m torch_fork_overlay apply {_target_args(inst)}",
        )
    return OverlayError(
        f"cannot apply the v{series.version} series to {_describe(inst)}: "
        + ", ".join(f"{sp / r} is {s}" for r, s in sorted(bad.items()))
        + "; nothing was changed",
        cause="these files were modified by someone else (not pristine torch "
        f"{series.version}, not our patched result), or only part of the series is applied",
        next=f"reinstall pristine torch: {inst.reinstall} (it replaces those files: keep a copy of any edit "
        f"you need), then rerun: python -m torch_fork_overlay apply {_target_args(inst)}",
    )


def revert_install(
    *,
    python: str | None = None,
    site_packages: str | os.PathLike[str] | None = None,
    patches_dir: str | os.PathLike[str] | None = None,
    out: Printer = print,
) -> str:
    """Restore the byte-identical originals saved by ``apply_to_install``;
    or roll back an interrupted apply or revert (a journal on disk)."""
    inst = locate(python=python, site_packages=site_packages)
    with install_lock(inst, out=out):
        plan = jn.read_journal(inst)
        if plan is not None:
            done = _recover(inst, rels=sorted(plan.files), out=out)
            return (f"rolled back the interrupted {done.op}: {_describe(inst)} is pristine "
                    f"({len(done.files)} file(s) hash-checked)")
        state = st.read_state(inst.torch_dir, reinstall=inst.reinstall)
        found = jn.tidy(inst, sorted(state["files"]) if state else [])
        if found:
            out(f"removed {len(found)} leftover temp file(s) of an interrupted run: "
                + ", ".join(str(p) for p in found))
        if state is None:
            raise OverlayError(
                f"nothing to revert: {_describe(inst)} has no {st.STATE_NAME}, "
                "so torch_fork_overlay never applied a series there",
                cause="it was never patched, was already reverted, or is a patched wheel "
                "(which is undone by reinstalling torch, not by revert)",
                next=f"see what is installed: python -m torch_fork_overlay status {_target_args(inst)}",
            )
        plan = jn.Plan(op=jn.REVERT, inst=inst, series=str(state.get("series")),
                       patches=list(state.get("patches") or []), files=state["files"])
        out(f"checked: {_describe(inst)}; state file lists {len(plan.files)} file(s), "
            f"series v{plan.series}")
        actions = jn.check_roll_back(plan, what="revert")
        check_writable(_targets(inst, plan.files), what=_describe(inst))
        try:
            jn.begin_revert(plan)
        except OSError as e:
            if plan.journal.exists():
                raise _stopped(inst, plan, e) from e
            raise OverlayError(
                f"could not write {e.filename} ({e.strerror}) while starting to revert "
                f"{_describe(inst)}; nothing was changed",
                cause="the disk is full, or the install became read-only",
                next="fix that, then rerun the same command",
            ) from e
        try:
            jn.roll_back(plan, actions)
        except OSError as e:
            raise _stopped(inst, plan, e) from e
    return f"reverted {_describe(inst)} to pristine ({len(plan.files)} file(s) restored, hash-checked)"
