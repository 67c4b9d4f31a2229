"""The one apply implementation: a series onto a tree, and onto an install.

``patch_tree`` applies a series to any directory laid out like the PyTorch
repository root (a staging copy, an unpacked wheel, site-packages, a
checkout).  ``apply_to_install`` / ``revert_install`` wrap it with the
checks and the atomic replace an install needs:

1. every precondition is checked first: a series for this release, every
   touched file pristine per the manifest, every target directory and file
   writable (by creating a temp file: ``os.access`` is meaningless as root);
2. every patched file is produced in a staging copy and its hash checked
   against the manifest;
3. only then are files replaced, each with ``os.replace`` from a temp file in
   the same directory; if one replace fails, those already done are rolled
   back, so the install is left exactly as it was.

Revert restores from the byte-identical backup taken at apply time rather
than reverse-applying the series: the patches in the checkout may have
changed since (e.g. the placeholder was replaced by the real patch), and a
backup still restores exactly what pip installed.  Both the backup and the
restored file are hash-checked against the state file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from . import state as st
from .errors import OverlayError
from .locate import TorchInstall, locate
from .proc import run
from .series import Series, load_series

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
    """Prove each directory (and existing file) can be changed by trying."""
    dirs = sorted({p if p.is_dir() else p.parent for p in paths})
    for d in dirs:
        try:
            fd, tmp = tempfile.mkstemp(prefix=".tfo-check-", dir=d)
            os.close(fd)
            os.unlink(tmp)
        except OSError as e:
            raise _readonly(d, e, what) from None
    for p in paths:
        if p.is_file():
            try:
                with open(p, "ab"):
                    pass
            except OSError as e:
                raise _readonly(p, e, what) from None


def _readonly(path: Path, e: OSError, what: str) -> OverlayError:
    return OverlayError(
        f"cannot write to {path} ({e.strerror}) while patching {what}; nothing was changed",
        cause="the install is read-only: a system or shared site-packages, an immutable "
        "directory, a read-only mount, or owned by another user",
        next="rerun as the owner of that environment, or install a patched wheel into "
        "your own venv: python -m torch_fork_overlay wheel --version 2.15.0",
    )


def commit_changes(changes: list[tuple[Path, bytes | None]]) -> None:
    """Write every (path, data) -- None deletes -- all or nothing.

    All new contents are first written to temp files next to their target;
    then each is moved in with ``os.replace``. On any failure the targets
    already replaced are restored from memory and temp files are removed;
    an ``OSError`` is reported as ``OverlayError``.
    """
    temps: dict[Path, Path] = {}
    made_dirs: list[Path] = []
    done: list[tuple[Path, bytes | None]] = []
    current: Path | None = None
    try:
        for path, data in changes:
            current = path
            if data is None:
                continue
            if not path.parent.exists():
                path.parent.mkdir(parents=True)
                made_dirs.append(path.parent)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tfo-tmp", dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if path.exists():
                shutil.copymode(path, tmp)
            else:
                os.chmod(tmp, 0o644)
            temps[path] = Path(tmp)
        for path, data in changes:
            current = path
            old = path.read_bytes() if path.is_file() else None
            if data is None:
                if old is not None:
                    path.unlink()
            else:
                os.replace(temps[path], path)
                del temps[path]
            done.append((path, old))
    except BaseException as exc:
        for path, old in reversed(done):
            try:
                if old is None:
                    path.unlink(missing_ok=True)
                else:
                    path.write_bytes(old)
            except OSError:
                pass
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        for d in reversed(made_dirs):
            try:
                d.rmdir()
            except OSError:
                pass
        if isinstance(exc, OSError):
            raise OverlayError(
                f"could not write {current} ({exc.strerror}); the "
                f"{len(done)} file(s) already replaced were restored, nothing was changed",
                cause="the file system refused a write after the checks passed: a path "
                "changed type, the disk is full, or another process is changing the install",
                next="fix the path named above, then rerun the same command",
            ) from exc
        raise


def _describe(inst: TorchInstall) -> str:
    return f"torch {inst.version} at {inst.torch_dir}"


def _target_args(inst: TorchInstall) -> str:
    return f"--site-packages {inst.site_packages}"


def apply_to_install(
    *,
    python: str | None = None,
    site_packages: str | os.PathLike[str] | None = None,
    patches_dir: str | os.PathLike[str] | None = None,
    out: Printer = print,
) -> str:
    """Apply the matching series to an installed torch. Returns a summary.

    Idempotent: a torch whose files already match the patched hashes is
    reported as already applied and left alone.
    """
    inst = locate(python=python, site_packages=site_packages)
    series = load_series(inst.version, patches_dir=patches_dir)
    sp = inst.site_packages
    files = series.manifest
    states = {
        rel: st.classify(sp / rel, pristine=v["pristine"], patched=v["patched"])
        for rel, v in files.items()
    }
    out(f"checked: torch {inst.version} (git {inst.git_version}) at {inst.torch_dir}; "
        f"series {series.dir}; {len(files)} file(s): "
        + ", ".join(f"{r} {s}" for r, s in sorted(states.items())))
    if all(s == st.PATCHED for s in states.values()):
        return f"already applied: {_describe(inst)} matches the v{series.version} series; nothing to do"
    bad = {r: s for r, s in states.items() if s != st.PRISTINE}
    if bad:
        raise OverlayError(
            f"cannot apply the v{series.version} series to {_describe(inst)}: "
            + ", ".join(f"{sp / r} is {s}" for r, s in sorted(bad.items()))
            + "; nothing was changed",
            cause="these files were modified by someone else (not pristine torch "
            f"{series.version}, not our patched result), or only part of the series is applied",
            next=f"reinstall pristine torch: pip install --force-reinstall --no-deps "
            f"torch=={inst.version}, then rerun: python -m torch_fork_overlay apply {_target_args(inst)}",
        )
    torch_dir = inst.torch_dir
    targets = [sp / r for r in files] + [torch_dir]
    if inst.record:
        targets.append(inst.record)
    check_writable(targets, what=_describe(inst))

    with tempfile.TemporaryDirectory(prefix="tfo-stage-") as stage:
        stage = Path(stage)
        for rel, v in files.items():
            if v["pristine"] is not None:
                (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(sp / rel, stage / rel)
        try:
            applied = patch_tree(root=stage, series=series, include_tests=False)
        except OverlayError as e:
            e.what += f"\n  (applied to a staging copy; nothing in {inst.site_packages} was changed)"
            raise
        new = {rel: (stage / rel).read_bytes() for rel in files}
    for rel, data in new.items():
        got = st.sha256_bytes(data)
        if got != files[rel]["patched"]:
            raise OverlayError(
                f"the v{series.version} series produced {rel} with sha256 {got}, but "
                f"{series.dir / 'manifest.json'} expects {files[rel]['patched']}; nothing was changed",
                cause="the manifest is stale: a patch was regenerated without rewriting it",
                next=f"python -m torch_fork_overlay refresh --manifest-only --version {series.version}",
            )

    changes: list[tuple[Path, bytes | None]] = []
    state_files: dict[str, dict] = {}
    backups: dict[str, bytes] = {}
    for rel in sorted(files):
        orig = (sp / rel).read_bytes() if files[rel]["pristine"] is not None else None
        b_rel = None
        if orig is not None:
            b_path = st.backup_path(torch_dir, rel)
            b_rel = b_path.relative_to(sp).as_posix()
            backups[b_rel] = orig
            changes.append((b_path, orig))
        state_files[rel] = {
            "pristine": files[rel]["pristine"],
            "patched": files[rel]["patched"],
            "backup": b_rel,
        }
    changes += [(sp / rel, new[rel]) for rel in sorted(files)]
    state_rel = st.state_path(torch_dir).relative_to(sp).as_posix()
    record_text = inst.record.read_bytes().decode("utf-8") if inst.record else None
    if record_text is not None:
        originals = st.record_lines_for(record_text, sorted(files))
        for rel in state_files:
            state_files[rel]["record_line"] = originals[rel]
    state_bytes = st.make_state(
        series_version=series.version, patches=applied, files=state_files, site_packages=sp
    )
    changes.append((st.state_path(torch_dir), state_bytes))
    if record_text is not None:
        replace = {rel: st.record_line(rel, new[rel]) for rel in files}
        add = [st.record_line(b, d) for b, d in backups.items()]
        add.append(st.record_line(state_rel, state_bytes))
        changes.append((inst.record, st.edit_record(record_text, replace=replace, add=add).encode()))
    commit_changes(changes)
    return (
        f"applied {len(applied)} patch(es) of the v{series.version} series to {_describe(inst)}: "
        f"{', '.join(applied)}\n  undo with: python -m torch_fork_overlay revert {_target_args(inst)}"
    )


def revert_install(
    *,
    python: str | None = None,
    site_packages: str | os.PathLike[str] | None = None,
    patches_dir: str | os.PathLike[str] | None = None,
    out: Printer = print,
) -> str:
    """Restore the byte-identical originals saved by ``apply_to_install``."""
    inst = locate(python=python, site_packages=site_packages)
    sp, torch_dir = inst.site_packages, inst.torch_dir
    state = st.read_state(torch_dir)
    if state is None:
        raise OverlayError(
            f"nothing to revert: {_describe(inst)} has no {st.STATE_NAME}, "
            "so torch_fork_overlay never applied a series there",
            cause="it was never patched, was already reverted, or is a patched wheel "
            "(which is undone by reinstalling torch, not by revert)",
            next=f"see what is installed: python -m torch_fork_overlay status {_target_args(inst)}",
        )
    files: dict[str, dict] = state["files"]
    bad = []
    for rel, v in sorted(files.items()):
        s = st.classify(sp / rel, pristine=v["pristine"], patched=v["patched"])
        if s != st.PATCHED:
            bad.append(f"{sp / rel} is {s}")
        if v.get("backup") and st.sha256_file(sp / v["backup"]) != v["pristine"]:
            bad.append(f"backup {sp / v['backup']} is missing or changed")
    out(f"checked: {_describe(inst)}; state file lists {len(files)} file(s), "
        f"series v{state['series']}")
    if bad:
        raise OverlayError(
            f"cannot revert {_describe(inst)}: {'; '.join(bad)}; nothing was changed",
            cause="files were modified after torch_fork_overlay applied the series",
            next=f"reinstall pristine torch: pip install --force-reinstall --no-deps torch=={inst.version}",
        )
    targets = [sp / r for r in files] + [torch_dir]
    if inst.record:
        targets.append(inst.record)
    check_writable(targets, what=_describe(inst))

    changes: list[tuple[Path, bytes | None]] = []
    replace: dict[str, str | None] = {}
    for rel, v in sorted(files.items()):
        orig = (sp / v["backup"]).read_bytes() if v.get("backup") else None
        changes.append((sp / rel, orig))
        replace[rel] = v.get("record_line")
    for rel, v in sorted(files.items()):
        if v.get("backup"):
            changes.append((sp / v["backup"], None))
            replace[v["backup"]] = None
    changes.append((st.state_path(torch_dir), None))
    replace[st.state_path(torch_dir).relative_to(sp).as_posix()] = None
    if inst.record:
        text = inst.record.read_bytes().decode("utf-8")  # keep \r\n
        changes.append((inst.record, st.edit_record(text, replace=replace, add=[]).encode()))
    commit_changes(changes)
    try:
        (torch_dir / st.BACKUP_DIR).rmdir()
    except OSError:
        pass
    for rel, v in files.items():
        assert st.sha256_file(sp / rel) == v["pristine"], rel
    return f"reverted {_describe(inst)} to pristine ({len(files)} file(s) restored, hash-checked)"
