"""Which series serves a torch release: decided by hashes, not by the version.

``patches/`` holds one folder per supported release, ``v<release>/``.  As
Spack attaches a patch to a range of versions, a series serves every torch
whose files it touches are the bytes its manifest records: each file listed
in ``manifest.json`` has there its pristine sha256 (or its patched one, for
an install or wheel already patched).  So 2.9.0 is served by ``v2.9.1`` when
the files that series touches are identical in both, and ``2.13.0+cpu`` by
``v2.13.0``; a series is never copied just to carry another name.

The candidates are tried in this order, and the first that matches serves:

1. the series an install's state file names (the one applied there);
2. the release's own folder (``series.own_release``: ``v2.13.0+cpu``, else
   ``v2.13.0``);
3. the other series of the same major.minor, newest first; then all the
   others, newest first.

A series whose manifest lists only files it creates (no pristine hash) has
nothing to compare, so it serves only its own release.  When nothing
matches, the own folder (or the state file's series) is still returned, as a
non-match, so that ``status`` and ``apply`` can name the files that differ;
a release with neither is refused, with the list of supported releases.

Who reads which bytes: ``apply`` / ``status`` the install, ``wheel`` the
wheel (so ``wheel --version X`` without a folder ``vX`` first downloads X),
``source-build`` and ``export`` the checkout.

``releases_table`` prints the "Supported releases" table of the README from
the series folders and the last ``tools/test-releases`` run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Callable

from packaging.version import Version

from .errors import OverlayError
from .series import (
    MANIFEST,
    Series,
    base_version,
    load_series,
    own_release,
    patches_root,
    read_manifest,
    supported_versions,
)

HashOf = Callable[[str], "str | None"]  # repo-root relative path -> sha256 hex, None if absent

PRISTINE, PATCHED, MIXED, NONE = "pristine", "patched", "mixed", "none"


@dataclasses.dataclass(frozen=True)
class Serving:
    release: str  # the torch asked about, e.g. "2.9.0", "2.13.0+cpu"
    series: Series
    match: str  # the touched files: PRISTINE, PATCHED, MIXED (some of each) or NONE
    own_folder: str | None  # the folder release made for this release (``own_release``), if any

    @property
    def own(self) -> bool:
        return self.series.version == self.own_folder

    def describe(self) -> str:
        """What ``status`` prints after ``served by:``: ``series v2.9.1: touched
        files identical (no folder v2.9.0)``, ``series v2.15.0 (this release's
        own)``, or ``nothing: ...`` for a non-match."""
        s = f"series v{self.series.version}"
        if self.match == NONE:
            whose = "this release's own" if self.own else "the one its state file names"
            return (f"nothing: the files the v{self.series.version} series ({whose}) touches match "
                    "neither its pristine nor its patched sha256")
        if self.own:
            return f"{s} (this release's own)"
        if self.own_folder is None:
            return f"{s}: touched files identical (no folder v{base_version(self.release)})"
        return f"{s}: touched files identical (they differ from those v{self.own_folder} was made for)"


def manifest_match(manifest: dict[str, dict[str, str | None]], hash_of: HashOf) -> str:
    """PRISTINE / PATCHED / MIXED when every listed file has its pristine or
    patched hash, else NONE."""
    seen = set()
    for rel, v in manifest.items():
        h = hash_of(rel)
        if h == v["patched"]:
            seen.add(PATCHED)
        elif h == v["pristine"]:  # None == None: a file the series creates, absent
            seen.add(PRISTINE)
        else:
            return NONE
    if not seen:
        return NONE
    return seen.pop() if len(seen) == 1 else MIXED


def cached(hash_of: HashOf) -> HashOf:
    memo: dict[str, str | None] = {}

    def get(rel: str) -> str | None:
        if rel not in memo:
            memo[rel] = hash_of(rel)
        return memo[rel]

    return get


def candidates(version: str, supported: list[str], *, applied: str | None = None) -> list[str]:
    """Series releases in the order they are tried for ``version`` (see the module doc)."""
    own = [v for v in dict.fromkeys([version, base_version(version)]) if v in supported][:1]
    mm = Version(base_version(version)).release[:2]
    newest_first = sorted(supported, key=Version, reverse=True)
    same = [v for v in newest_first if Version(v).release[:2] == mm]
    first = [applied] if applied in supported else []
    return list(dict.fromkeys(first + own + same + newest_first))


def find_serving(
    version: str,
    *,
    hash_of: HashOf,
    what: str,
    patches_dir: str | os.PathLike[str] | None = None,
    applied: str | None = None,
    next: str | None = None,
) -> Serving:
    """The series that serves ``version``, whose files ``hash_of`` reads.

    ``what`` names them in errors ("torch 2.9.0 at DIR", "the wheel W");
    ``applied`` is the series an install's state file names; ``next``
    replaces the refusal's next command.
    """
    root = patches_root(patches_dir)
    supported = supported_versions(root)
    own = own_release(version, root)
    hash_of = cached(hash_of)
    skipped = []
    for cand in candidates(version, supported, applied=applied):
        if cand in (own, applied):
            series = load_series(cand, patches_dir=root)  # its own errors are worth seeing
            manifest = series.manifest
        else:
            try:
                manifest = read_manifest(root / f"v{cand}" / MANIFEST, cand)
            except (OverlayError, OSError) as e:
                skipped.append(f"v{cand} ({getattr(e, 'what', e)})")
                continue
            if not any(v["pristine"] for v in manifest.values()):
                continue  # only created files: nothing to compare
        match = manifest_match(manifest, hash_of)
        if match != NONE:
            if cand not in (own, applied):
                series = load_series(cand, patches_dir=root)
            return Serving(release=version, series=series, match=match, own_folder=own)
    fallback = applied if applied in supported else own
    if fallback is not None:
        return Serving(release=version, series=load_series(fallback, patches_dir=root), match=NONE,
                       own_folder=own)
    raise refusal(version, what=what, root=root, supported=supported, skipped=skipped, next=next)


def refusal(version: str, *, what: str, root: Path, supported: list[str], skipped=(),
            next: str | None = None) -> OverlayError:
    base = base_version(version)
    if not supported:
        return OverlayError(
            f"no patch series for {what} in {root}: it holds no v<release>/ folder with a series file",
            cause="--patches-dir (or $TORCH_FORK_OVERLAY_PATCHES) names the wrong folder",
            next="point --patches-dir (or $TORCH_FORK_OVERLAY_PATCHES) at the project's patches/ folder",
        )
    newest = supported[-1]
    return OverlayError(
        f"no patch series for {what} in {root}: no folder v{base}/, and no series' manifest "
        "matches its files (the sha256 of each file the series touches)",
        cause=f"torch {version} is not a supported release: this project supports torch "
        f"{', '.join(supported)}; another release is served only by a series whose touched files "
        "it has byte for byte"
        + (f" (not compared, unreadable: {', '.join(skipped)})" if skipped else ""),
        next=next or f"pip install torch=={newest}, then rerun; or build a patched wheel of a supported "
        f"release: python -m torch_fork_overlay wheel --version {newest}",
    )


def file_hasher(root: Path) -> HashOf:
    """sha256 of ``root/rel`` (an install's site-packages, a checkout, an unpacked wheel)."""
    from .state import sha256_file

    return lambda rel: sha256_file(root / rel)


# -- the "Supported releases" table ---------------------------------------------

_CHECKOUT = Path(__file__).resolve().parents[1]


def default_summary() -> Path:
    """``build/releases/summary.json`` of the source checkout (else of the current folder)."""
    root = _CHECKOUT if (_CHECKOUT / "patches").is_dir() else Path.cwd()
    return root / "build" / "releases" / "summary.json"


def default_release(requirements: str | os.PathLike[str] | None = None) -> str | None:
    """The release ``tools/test`` covers: ``torch==X`` in requirements.txt."""
    path = Path(requirements) if requirements else _CHECKOUT / "requirements.txt"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    m = re.search(r"^torch==([0-9][^\s;#]*)", text, re.M)
    return m.group(1) if m else None


def _touches(series: Series) -> str:
    files = series.install_files()
    groups: dict[str, int] = {}
    for f in files:
        parts = f.split("/")
        key = "/".join(parts[:2]) + ("/" if len(parts) > 2 else "")
        groups[key] = groups.get(key, 0) + 1
    what = ", ".join(f"`{k}`" + (f" ({n})" if n > 1 else "") for k, n in sorted(groups.items()))
    tests = sum(1 for p in series.patches if p.is_test)
    return f"{len(files)} file(s): {what}" + (f"; {tests} test patch(es)" if tests else "")


def _duration(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s} s" if m else f"{s} s"


def releases_table(*, patches_dir=None, summary: str | os.PathLike[str] | None = None,
                   default: str | None = None) -> list[dict[str, str]]:
    """One row per series folder, oldest first: release, series, touches,
    tests (what the last ``tools/test-releases`` run ran) and result."""
    root = patches_root(patches_dir)
    runs: dict[str, dict] = {}
    when = None
    spath = Path(summary) if summary is not None else default_summary()
    if spath.is_file():
        try:
            data = json.loads(spath.read_text(encoding="utf-8"))
            when = data.get("finished")
            runs = {r["release"]: r for r in data.get("releases", [])}
        except (ValueError, KeyError, TypeError) as e:
            raise OverlayError(
                f"cannot read {spath} ({type(e).__name__}: {e})",
                cause="it was truncated or edited by hand",
                next="rerun tools/test-releases, which rewrites it",
            ) from None
    rows = []
    for release in supported_versions(root):
        series = load_series(release, patches_dir=root)
        run = runs.get(release)
        if run is not None:
            installed = run.get("installed") or "?"
            tests = "seed case stock + patched; " + run.get("tests", "contract tests")
            if release == default:
                tests = "tools/test: the whole suite (test/); tools/test-releases: " + tests
            result = run.get("result", "?") + f" (torch {installed}, {_duration(run.get('seconds', 0))}"
            result += f", {when[:10]})" if when else ")"
        elif release == default:
            tests, result = "tools/test: the whole suite (test/)", "see .ci/run (tools/test)"
        else:
            tests, result = "none yet", "not in the last tools/test-releases run"
        rows.append({"release": release, "series": f"`patches/v{release}/` ({len(series.patches)} patch(es))",
                     "touches": _touches(series), "tests": tests, "result": result})
    return rows


def format_table(rows: list[dict[str, str]], *, markdown: bool) -> str:
    cols = [("release", "release"), ("series", "series"), ("touches", "what it touches"),
            ("tests", "tests run"), ("result", "result")]
    if markdown:
        out = ["| " + " | ".join(h for _, h in cols) + " |", "|" + " --- |" * len(cols)]
        out += ["| " + " | ".join(r[k] for k, _ in cols) + " |" for r in rows]
        return "\n".join(out)
    return "\n\n".join("\n".join(f"{h + ':':<17}{r[k].replace('`', '')}" for k, h in cols) for r in rows)
