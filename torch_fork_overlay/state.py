"""Hashes, per-file state, the state file and RECORD edits for an install.

What the tool writes into an install (all listed in torch's RECORD, so
``pip uninstall torch`` removes them, and all removed by ``revert``):

* ``torch/_fork_overlay_state.json`` -- who wrote it, how to remove it, the
  series applied, and per file the pristine and patched sha256 plus the
  file's original RECORD line;
* ``torch/_fork_overlay_backup/<path with / as __>.orig`` -- the byte-identical original of
  every patched file (not importable: ``.orig`` suffix, no ``__init__``).

While an apply or revert runs (see ``journal``) it also writes
``torch/_fork_overlay_journal.json`` and ``.<name>.tfo-tmp`` temp files; each
is listed in RECORD *before* it is created, so even after a kill
``pip uninstall torch`` removes them, and a finished run leaves none of them.
Outside ``torch/``, in site-packages itself, live only the lock file and the
temp file of RECORD (``.torch-fork-overlay.*``): never importable, removed at
the end of every run, and by the next run after a kill.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
from pathlib import Path

from .errors import OverlayError
from .series import check_relpath

STATE_NAME = "_fork_overlay_state.json"
JOURNAL_NAME = "_fork_overlay_journal.json"
BACKUP_DIR = "_fork_overlay_backup"
TMP_SUFFIX = ".tfo-tmp"
# In site-packages, next to torch/ (see the module docstring):
LOCK_NAME = ".torch-fork-overlay.lock"
RECORD_TMP_NAME = ".torch-fork-overlay.RECORD" + TMP_SUFFIX
PRISTINE, PATCHED, UNKNOWN, ABSENT = "pristine", "patched", "unknown", "absent"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str | None:
    """Hex sha256 of a file, None when it does not exist."""
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        return None


def record_hash(data: bytes) -> str:
    """The ``sha256=<urlsafe b64, no padding>`` form RECORD uses."""
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def record_line(relpath: str, data: bytes) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow([relpath, record_hash(data), len(data)])
    return buf.getvalue()


def classify(path: Path, *, pristine: str | None, patched: str) -> str:
    """``pristine`` / ``patched`` / ``unknown`` (changed by someone else)."""
    h = sha256_file(path)
    if h == patched:
        return PATCHED
    if h == pristine:  # also covers pristine None == absent file
        return PRISTINE
    return UNKNOWN


def state_path(torch_dir: Path) -> Path:
    return torch_dir / STATE_NAME


def backup_path(torch_dir: Path, relpath: str) -> Path:
    """One flat folder: ``torch/_guards.py`` -> ``torch__guards.py.orig``."""
    return torch_dir / BACKUP_DIR / (relpath.replace("/", "__") + ".orig")


def journal_path(torch_dir: Path) -> Path:
    return torch_dir / JOURNAL_NAME


def temp_path(path: Path) -> Path:
    """The one temp file of ``path``: ``dir/.name.tfo-tmp`` (same directory, so
    ``os.replace`` is atomic; a fixed name, so a run killed before renaming it
    leaves a file the next run knows to remove)."""
    return path.with_name(f".{path.name}{TMP_SUFFIX}")


def is_ours(relpath: str) -> bool:
    """True for RECORD paths the tool itself writes into an install."""
    return (
        relpath in (f"torch/{STATE_NAME}", f"torch/{JOURNAL_NAME}")
        or relpath.startswith(f"torch/{BACKUP_DIR}/")
        or relpath.endswith(TMP_SUFFIX)
    )


def mode_of(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def read_json(path: Path, *, what: str, reinstall: str) -> dict | None:
    """A JSON object written by the tool (state file, journal); None when
    absent; an ``OverlayError`` naming the file when it cannot be read."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        problem = e.strerror
    else:
        try:
            data = json.loads(raw.decode("utf-8"))
            if isinstance(data, dict) and isinstance(data.get("files"), dict):
                return data
            problem = "not an object with a 'files' table"
        except (UnicodeDecodeError, ValueError) as e:
            problem = f"not valid JSON: {e}"
    raise OverlayError(
        f"cannot read the {what} {path} ({problem})",
        cause="it was truncated or edited by hand, or the disk is failing",
        next=f"reinstall pristine torch, which also removes it (it is listed in RECORD): {reinstall}",
    )


def check_files_table(files: dict, *, torch_dir: Path, where: Path, reinstall: str) -> dict[str, dict]:
    """Validate the per-file table of a state file or journal: paths stay
    inside the install and backups have the names the tool gives them."""
    site_packages = torch_dir.parent
    for rel, v in files.items():
        ok = isinstance(v, dict) and isinstance(v.get("patched"), str) and (
            v.get("pristine") is None or isinstance(v.get("pristine"), str))
        if ok:
            check_relpath(rel, where=str(where))
            want = backup_path(torch_dir, rel).relative_to(site_packages).as_posix()
            ok = v.get("backup") in (None, want) and (v.get("backup") is not None) == (v["pristine"] is not None)
        if not ok:
            raise OverlayError(
                f"{where} has a malformed entry for {rel!r}: {v!r}",
                cause="it was edited by hand or written by an incompatible version of the tool",
                next=f"reinstall pristine torch, which also removes it: {reinstall}",
            )
    return files


def read_state(torch_dir: Path, *, reinstall: str = "pip install --force-reinstall --no-deps torch") -> dict | None:
    p = state_path(torch_dir)
    data = read_json(p, what="state file", reinstall=reinstall)
    if data is not None:
        check_files_table(data["files"], torch_dir=torch_dir, where=p, reinstall=reinstall)
    return data


def make_state(
    *, series_version: str, patches: list[str], files: dict[str, dict], site_packages: Path
) -> bytes:
    data = {
        "written_by": "torch_fork_overlay (python -m torch_fork_overlay apply)",
        "how_to_remove": f"python -m torch_fork_overlay revert --site-packages {site_packages}"
        " (or pip uninstall torch, which removes this file: it is listed in RECORD)",
        "series": series_version,
        "patches": patches,
        "files": files,
    }
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def split_record(text: str) -> list[tuple[str, str]]:
    """RECORD as (path, raw line incl. newline) pairs, order preserved."""
    out = []
    for raw in text.splitlines(keepends=True):
        stripped = raw.rstrip("\r\n")
        if not stripped:
            out.append(("", raw))
            continue
        path = next(csv.reader([stripped]))[0]
        out.append((path, raw))
    return out


def edit_record(
    text: str, *, replace: dict[str, str | None], add: list[str]
) -> str:
    """Return RECORD text with lines of ``replace`` keys swapped for the given
    line (``None`` drops it) and ``add`` lines appended before the RECORD
    entry itself; untouched lines keep their exact bytes."""
    entries = split_record(text)
    nl = "\r\n" if text.endswith("\r\n") else "\n"
    out: list[str] = []
    seen = set()
    for path, raw in entries:
        if path in replace:
            if path in seen:
                continue  # a duplicate line (as unlocked concurrent runs of old versions wrote)
            seen.add(path)
            new = replace[path]
            if new is not None:
                out.append(new + nl)
        else:
            out.append(raw)
    extra = [line + nl for line in add]
    extra += [replace[p] + nl for p in replace if p not in seen and replace[p] is not None]
    # keep the RECORD's own line ("...dist-info/RECORD,,") last, like pip writes it
    idx = next((i for i, l in enumerate(out) if l.split(",")[0].endswith("/RECORD")), len(out))
    return "".join(out[:idx] + extra + out[idx:])


def record_intent(text: str, paths: list[str]) -> str:
    """RECORD listing ``paths`` (files about to be written) with an empty hash,
    so that ``pip uninstall`` removes them even if the run is killed; paths
    already listed keep their line."""
    listed = {p for p, _ in split_record(text)}
    return edit_record(text, replace={}, add=[_row(p) for p in paths if p not in listed])


def record_normalize(text: str, *, replace: dict[str, str | None], exists) -> str:
    """RECORD with ``replace`` applied (see ``edit_record``) and every other
    line of a path the tool writes (``is_ours``) dropped unless ``exists(path)``."""
    drop = {p: None for p, _ in split_record(text) if p and is_ours(p) and p not in replace and not exists(p)}
    return edit_record(text, replace={**replace, **drop}, add=[])


def _row(path: str) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow([path, "", ""])
    return buf.getvalue()


def record_lines_for(text: str, paths: list[str]) -> dict[str, str | None]:
    """Original RECORD lines (without newline) of ``paths``; None if absent."""
    by_path = {p: raw.rstrip("\r\n") for p, raw in split_record(text)}
    return {p: by_path.get(p) for p in paths}
