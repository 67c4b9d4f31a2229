"""The journal: apply and revert survive a kill at any point (the dpkg way).

Every change an apply or revert makes to an install goes through this module,
in this order:

1. **intent**: RECORD lists every file the run may create (journal, backups,
   state file, temp files) *before* any of them exists, so that even after a
   kill ``pip uninstall torch`` leaves nothing behind in ``torch/``;
2. **the journal** ``torch/_fork_overlay_journal.json``: the operation and, per
   touched file, its pristine and patched sha256, its backup and its original
   RECORD line, made durable (temp file, fsync, rename, fsync of the
   directory) before the first file is touched;
3. **the changes**, each atomic and durable (temp file + fsync + ``os.replace``
   + fsync of the directory, or an unlink): backups first, then the patched
   files, the state file, RECORD;
4. the journal is removed, then its RECORD line: the run is finished.

Recovery is deterministic and goes one way: a journal on disk means a run
stopped between 2 and 4, and ``roll_back`` returns the install to pristine
from the backups.  That is always possible: apply writes every backup before
the first patched file replaces its original, and revert uses up a backup
only by renaming it onto its original.  ``revert`` *is* that roll-back;
``apply`` rolls back an interrupted run and then applies afresh.  Every step
of a roll-back is idempotent and the journal goes last, so a roll-back that
is itself killed is finished by the next run.  A run killed before its
journal existed changed nothing but RECORD's intent lines and temp files:
``tidy`` removes those.

Fault injection, for the tests: ``TFO_FAULT_AT=N[:kill|stop|enospc]`` makes the
N-th durable step of a run SIGKILL the process (the default), SIGSTOP it, or
fail with ENOSPC; ``TFO_FAULT_LOG=FILE`` appends ``N step path`` per step.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import time
from pathlib import Path
from typing import Callable

from . import state as st
from .errors import OverlayError
from .locate import TorchInstall

ENV_FAULT = "TFO_FAULT_AT"
ENV_FAULT_LOG = "TFO_FAULT_LOG"
APPLY, REVERT = "apply", "revert"
Printer = Callable[[str], None]

_steps = 0


def step(what: str, path: os.PathLike[str] | str, *, can_fail: bool = True) -> None:
    """Called just before each durable step; the fault-injection hook."""
    global _steps
    _steps += 1
    log = os.environ.get(ENV_FAULT_LOG)
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{_steps} {what} {path}\n")
    n, _, action = os.environ.get(ENV_FAULT, "").partition(":")
    if not n or int(n) != _steps:
        return
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "enospc":
        if can_fail:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    else:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # not reached


# -- durable file operations ------------------------------------------------

def _fsync_dir(d: Path) -> None:
    """Make a rename or unlink in ``d`` durable."""
    fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):  # file systems that cannot
            raise
    finally:
        os.close(fd)


def write_temp(path: Path, data: bytes, *, mode: int, temp: Path | None = None) -> Path:
    """Write ``data`` to the temp file of ``path`` (fsync'd, ``mode`` set) and
    return the temp file; on any failure the temp file is removed."""
    tmp = temp or st.temp_path(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data)
            half = len(data) // 2
            _write_all(fd, view[:half])
            step("write", tmp)  # a kill here leaves a half-written temp file
            _write_all(fd, view[half:])
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data):]


def replace(src: Path, dst: Path) -> None:
    step("replace", dst)
    os.replace(src, dst)
    _fsync_dir(dst.parent)
    if src.parent != dst.parent:
        _fsync_dir(src.parent)


def write_file(path: Path, data: bytes, *, mode: int = 0o644, temp: Path | None = None) -> None:
    """Atomically and durably replace ``path`` with ``data``."""
    tmp = write_temp(path, data, mode=mode, temp=temp)
    try:
        replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def unlink(path: Path) -> None:
    """Remove the file ``path`` if there is one (a directory is never ours)."""
    if os.path.lexists(path) and (path.is_symlink() or not path.is_dir()):
        step("unlink", path)
        path.unlink(missing_ok=True)
        _fsync_dir(path.parent)


def mkdir(path: Path) -> None:
    if not path.is_dir():
        step("mkdir", path)
        path.mkdir()
        _fsync_dir(path.parent)


def rmdir(path: Path) -> None:
    """Remove ``path`` if it is an empty directory."""
    if path.is_dir() and not any(path.iterdir()):
        step("rmdir", path)
        path.rmdir()
        _fsync_dir(path.parent)


# -- the plan of one run, which is what the journal holds -------------------

@dataclasses.dataclass
class Plan:
    op: str  # APPLY or REVERT
    inst: TorchInstall
    series: str
    patches: list[str]
    # rel -> {"pristine": sha | None, "patched": sha, "backup": rel | None, "record_line": str | None}
    files: dict[str, dict]

    @property
    def sp(self) -> Path:
        return self.inst.site_packages

    @property
    def journal(self) -> Path:
        return st.journal_path(self.inst.torch_dir)

    @property
    def state(self) -> Path:
        return st.state_path(self.inst.torch_dir)

    def rel(self, path: Path) -> str:
        return path.relative_to(self.sp).as_posix()

    def backups(self) -> list[Path]:
        return [self.sp / v["backup"] for _, v in sorted(self.files.items()) if v["backup"]]

    def temps(self) -> list[Path]:
        """Every temp file this run may create inside the install."""
        targets = [self.sp / r for r in sorted(self.files)] + self.backups() + [self.state, self.journal]
        return [st.temp_path(p) for p in targets]

    def created(self) -> list[str]:
        """RECORD paths of every file this run may create, in RECORD order."""
        return [self.rel(p) for p in self.backups() + [self.state, self.journal] + self.temps()]

    def to_json(self) -> bytes:
        sp = self.sp
        data = {
            "written_by": f"torch_fork_overlay (python -m torch_fork_overlay {self.op}), pid {os.getpid()}",
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "how_to_finish": f"python -m torch_fork_overlay revert --site-packages {sp} rolls it "
            f"back to pristine; python -m torch_fork_overlay apply --site-packages {sp} rolls it "
            "back and applies again",
            "op": self.op,
            "torch": self.inst.version,
            "series": self.series,
            "patches": self.patches,
            "files": self.files,
        }
        return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def read_journal(inst: TorchInstall) -> Plan | None:
    path = st.journal_path(inst.torch_dir)
    data = st.read_json(path, what="journal", reinstall=inst.reinstall)
    if data is None:
        return None
    if data.get("op") not in (APPLY, REVERT):
        raise OverlayError(
            f"the journal {path} names an unknown operation {data.get('op')!r}",
            cause="it was edited by hand or written by an incompatible version of the tool",
            next=f"reinstall pristine torch, which also removes it: {inst.reinstall}",
        )
    files = st.check_files_table(data["files"], torch_dir=inst.torch_dir, where=path,
                                 reinstall=inst.reinstall)
    return Plan(op=data["op"], inst=inst, series=str(data.get("series")),
                patches=list(data.get("patches") or []), files=files)


# -- RECORD ------------------------------------------------------------------

def read_record_text(inst: TorchInstall) -> str | None:
    """torch's RECORD as text (line ends kept), None without one."""
    if inst.record is None:
        return None
    raw = inst.record.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise OverlayError(
            f"{inst.record} is not UTF-8 ({e})",
            cause="RECORD was damaged or edited with another encoding",
            next=f"reinstall torch: {inst.reinstall}",
        ) from None


def _edit_record(plan: Plan, edit: Callable[[str], str]) -> None:
    text = read_record_text(plan.inst)
    if text is None:
        return
    new = edit(text)
    if new != text:
        record = plan.inst.record
        write_file(record, new.encode("utf-8"), mode=st.mode_of(record),
                   temp=plan.sp / st.RECORD_TMP_NAME)


def _exists(plan: Plan) -> Callable[[str], bool]:
    return lambda rel: os.path.islink(plan.sp / rel) or os.path.isfile(plan.sp / rel)


def _record_tidy(plan: Plan) -> None:
    _edit_record(plan, lambda t: st.record_normalize(t, replace={}, exists=_exists(plan)))


# -- apply -------------------------------------------------------------------

def commit_apply(plan: Plan, *, originals: dict[str, bytes], patched: dict[str, bytes],
                 modes: dict[str, int], state_bytes: bytes, out: Printer) -> None:
    """Steps 1-4 of the module docstring for an apply. On any failure the
    install is rolled back to exactly what it was; a failure that the
    roll-back cannot undo leaves the journal for the next run."""
    sp = plan.sp
    try:
        _edit_record(plan, lambda t: st.record_intent(t, plan.created()))
        write_file(plan.journal, plan.to_json())
        if plan.backups():
            mkdir(plan.backups()[0].parent)
        for rel, v in sorted(plan.files.items()):
            if v["backup"]:
                write_file(sp / v["backup"], originals[rel], mode=modes[rel])
        temps = []
        for rel in sorted(plan.files):
            if not (sp / rel).parent.is_dir():  # a new file in a new directory
                mkdir((sp / rel).parent)
            temps.append((write_temp(sp / rel, patched[rel], mode=modes.get(rel, 0o644)), sp / rel))
        for tmp, target in temps:
            replace(tmp, target)
        write_file(plan.state, state_bytes)
        lines = {rel: st.record_line(rel, patched[rel]) for rel in sorted(plan.files)}
        lines.update({v["backup"]: st.record_line(v["backup"], originals[rel])
                      for rel, v in sorted(plan.files.items()) if v["backup"]})
        lines[plan.rel(plan.state)] = st.record_line(plan.rel(plan.state), state_bytes)
        _edit_record(plan, lambda t: st.record_normalize(t, replace=lines, exists=_exists(plan)))
        unlink(plan.journal)
        _record_tidy(plan)
    except BaseException as exc:
        _undo_failed_apply(plan, exc, out=out)
        raise


def _undo_failed_apply(plan: Plan, exc: BaseException, *, out: Printer) -> None:
    try:
        roll_back(plan)
    except BaseException as exc2:
        raise OverlayError(
            f"apply of the v{plan.series} series to torch {plan.inst.version} at "
            f"{plan.inst.torch_dir} failed ({_describe(exc)}) and rolling it back failed "
            f"too ({_describe(exc2)}); the journal {plan.journal} records what is left to undo",
            cause="the file system refused writes: the disk is full, or it became read-only",
            next=f"fix that, then finish the roll-back: python -m torch_fork_overlay revert "
            f"--site-packages {plan.sp}",
        ) from exc2
    if isinstance(exc, OSError):
        raise OverlayError(
            f"could not write {exc.filename} ({exc.strerror}) while applying the "
            f"v{plan.series} series to torch {plan.inst.version} at {plan.inst.torch_dir}; "
            "everything was rolled back, nothing was changed",
            cause="the file system refused a write after the checks passed: the disk is full, "
            "a path changed type, or something outside torch_fork_overlay is changing the install",
            next="fix the path named above, then rerun the same command",
        ) from exc
    if isinstance(exc, KeyboardInterrupt):
        out(f"interrupted: rolled back, torch at {plan.inst.torch_dir} is unchanged")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    if isinstance(exc, OverlayError):
        return exc.what
    return type(exc).__name__ + (f": {exc}" if str(exc) else "")


# -- roll back (= revert) ----------------------------------------------------

RESTORE, DELETE, KEEP = "restore", "delete", "keep"


def check_roll_back(plan: Plan, *, what: str) -> dict[str, str]:
    """What rolling back to pristine does per file; raises ``OverlayError``,
    before anything is changed, when a file or a backup is not ours."""
    sp = plan.sp
    actions, bad = {}, []
    for rel, v in sorted(plan.files.items()):
        h = st.sha256_file(sp / rel)
        if h == v["pristine"]:  # also a file the series creates, still absent
            actions[rel] = KEEP
        elif h != v["patched"]:
            bad.append(f"{sp / rel} is {'missing' if h is None else st.UNKNOWN}")
        elif v["pristine"] is None:
            actions[rel] = DELETE
        elif st.sha256_file(sp / v["backup"]) != v["pristine"]:
            bad.append(f"backup {sp / v['backup']} is missing or changed")
        else:
            actions[rel] = RESTORE
    if bad:
        raise OverlayError(
            f"cannot {what} torch {plan.inst.version} at {plan.inst.torch_dir}: "
            f"{'; '.join(bad)}; nothing was changed",
            cause="files were modified after torch_fork_overlay applied the series "
            "(by hand, or by pip)",
            next=f"reinstall pristine torch: {plan.inst.reinstall} (it replaces those files: keep a copy "
            "of any edit you need)",
        )
    return actions


def roll_back(plan: Plan, actions: dict[str, str] | None = None) -> dict[str, str]:
    """Bring the install back to pristine per ``plan`` (steps 3-4 of a revert).
    Idempotent: safe to run again after a kill at any point."""
    sp = plan.sp
    if actions is None:
        actions = check_roll_back(plan, what="roll back")
    for rel, act in sorted(actions.items()):
        if act == RESTORE:
            replace(sp / plan.files[rel]["backup"], sp / rel)
        elif act == DELETE:
            unlink(sp / rel)
    for tmp in plan.temps():
        unlink(tmp)
    for b in plan.backups():
        unlink(b)
    unlink(plan.state)
    if plan.backups():
        rmdir(plan.backups()[0].parent)
    for rel, v in sorted(plan.files.items()):
        if v["pristine"] is None:
            rmdir((sp / rel).parent)
    unlink(sp / st.RECORD_TMP_NAME)
    lines: dict[str, str | None] = {rel: v.get("record_line") for rel, v in plan.files.items()}
    lines.update({plan.rel(p): None for p in plan.backups() + [plan.state]})
    _edit_record(plan, lambda t: st.record_normalize(t, replace=lines, exists=_exists(plan)))
    unlink(plan.journal)
    _record_tidy(plan)
    return actions


def begin_revert(plan: Plan) -> None:
    """Steps 1-2 of a revert: its intent and its journal. Then ``roll_back``."""
    try:
        _edit_record(plan, lambda t: st.record_intent(t, plan.created()))
        write_file(plan.journal, plan.to_json())
    except BaseException:
        # nothing but RECORD's intent lines and temp files changed: undo them
        # (best effort: whatever is left, the next run's tidy removes)
        if not plan.journal.exists():
            try:
                for tmp in plan.temps():
                    if tmp.is_symlink() or tmp.is_file():
                        tmp.unlink()
                _record_tidy(plan)
            except BaseException:
                pass
        raise


# -- what a run killed before its journal existed leaves behind --------------

def leftovers(inst: TorchInstall, rels: list[str]) -> list[Path]:
    """Temp files of the tool in the folders it writes to."""
    sp, torch_dir = inst.site_packages, inst.torch_dir
    dirs = {torch_dir, torch_dir / st.BACKUP_DIR} | {(sp / r).parent for r in rels}
    if inst.dist_info:
        dirs.add(inst.dist_info)
    found = [sp / st.RECORD_TMP_NAME] if os.path.lexists(sp / st.RECORD_TMP_NAME) else []
    for d in sorted(dirs):
        if d.is_dir():
            found += sorted(p for p in d.iterdir()
                            if (p.name.endswith(st.TMP_SUFFIX) or p.name.startswith(".tfo-check-"))
                            and (p.is_symlink() or not p.is_dir()))
    return found


def tidy(inst: TorchInstall, rels: list[str]) -> list[Path]:
    """Remove leftovers and RECORD lines of files that were never created;
    only while holding the install's lock and with no journal on disk."""
    found = leftovers(inst, rels)
    for p in found:
        unlink(p)
    plan = Plan(op=APPLY, inst=inst, series="", patches=[], files={})
    _record_tidy(plan)
    rmdir(inst.torch_dir / st.BACKUP_DIR)
    return found
