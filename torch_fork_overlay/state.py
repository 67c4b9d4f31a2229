"""Hashes, per-file state, the state file and RECORD edits for an install.

What the tool writes into an install (all listed in torch's RECORD, so
``pip uninstall torch`` removes them, and all removed by ``revert``):

* ``torch/_fork_overlay_state.json`` -- who wrote it, how to remove it, the
  series applied, and per file the pristine and patched sha256 plus the
  file's original RECORD line;
* ``torch/_fork_overlay_backup/<path with / as __>.orig`` -- the byte-identical original of
  every patched file (not importable: ``.orig`` suffix, no ``__init__``).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
from pathlib import Path

STATE_NAME = "_fork_overlay_state.json"
BACKUP_DIR = "_fork_overlay_backup"
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


def read_state(torch_dir: Path) -> dict | None:
    p = state_path(torch_dir)
    if not p.is_file():
        return None
    return json.loads(p.read_text(encoding="utf-8"))


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


def record_lines_for(text: str, paths: list[str]) -> dict[str, str | None]:
    """Original RECORD lines (without newline) of ``paths``; None if absent."""
    by_path = {p: raw.rstrip("\r\n") for p, raw in split_record(text)}
    return {p: by_path.get(p) for p in paths}
