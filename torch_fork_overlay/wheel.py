"""``wheel``: repack an official torch wheel with a series applied.

Uses the ``wheel`` package's own tooling: ``wheel unpack`` (which checks
every file against the wheel's RECORD while extracting) and
``wheel pack --local-version`` (which renames the ``.dist-info``, rewrites
METADATA's Version and writes a fresh RECORD).  ``wheel pack`` *replaces*
the local label, so we compute the full one ourselves: the existing label
(``cu132``, from METADATA or, where METADATA carries none as in the official
2.15.0 wheel, from ``torch/version.py``) plus ours: ``cu132.fakemode.1``;
the CPU wheel ``2.13.0+cpu`` becomes ``2.13.0+cpu.fakemode.1``.

The series is the one that serves the wheel's files (``releases``: by the
sha256 of the files each series touches, read from the wheel).  So
``--version X`` for a release without a folder ``vX`` must download X
first: only its files can tell whether a series serves it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Iterator

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from . import state as st
from .apply import patch_tree
from .errors import OverlayError
from .proc import run
from .releases import find_serving, refusal
from .series import base_version, own_release, patches_root, supported_versions

DEFAULT_LABEL = "fakemode.1"
ENV_CACHE = "TORCH_FORK_OVERLAY_CACHE"


@contextlib.contextmanager
def timed(step: str) -> Iterator[None]:
    """Banner + elapsed time, like PyTorch's tools/nightly.py ``@timed``."""
    print(f"==> {step}", flush=True)
    t0 = time.monotonic()
    yield
    print(f"    {step}: {time.monotonic() - t0:.1f}s", flush=True)


def default_cache_dir() -> Path:
    env = os.environ.get(ENV_CACHE)
    return Path(env) if env else Path.cwd() / ".cache"


def download_wheel(*, version: str, cache_dir: Path) -> Path:
    """``pip download torch==version`` (binary only, no deps) into the cache.

    Passes an empty constraints file via ``PIP_CONSTRAINT``: environment
    variables override pip.conf, so a site-wide ``constraint = ...`` cap
    (e.g. ``torch<=2.14.1``) cannot block fetching the release we patch,
    while the rest of pip.conf (index, find-links, cert) still applies.
    """
    dest = cache_dir / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    empty = cache_dir / "empty-constraints.txt"
    empty.write_text("")
    cp = run(
        [sys.executable, "-m", "pip", "download", f"torch=={version}", "--no-deps",
         "--only-binary=:all:", "-d", str(dest)],
        env={"PIP_CONSTRAINT": str(empty)},
        what=f"pip could not download the official torch {version} wheel",
        cause="no network access to the index, or no torch wheel for this Python/platform",
        next=f"download it yourself and pass it: python -m torch_fork_overlay wheel "
        f"--wheel /path/to/torch-{version}-*.whl",
    )
    for line in cp.stdout.splitlines():
        m = re.search(r"(?:Saved|File was already downloaded) (\S+\.whl)", line)
        if m:
            return Path(m.group(1))
    found = sorted([*dest.glob(f"torch-{version}-*.whl"), *dest.glob(f"torch-{version}+*.whl")])
    if not found:
        raise OverlayError(
            f"pip download torch=={version} finished but left no wheel in {dest}",
            cause="pip's output format changed or the download was not a wheel",
            next="pass the wheel explicitly: python -m torch_fork_overlay wheel --wheel PATH",
        )
    return found[-1]


def _next_wheel(path: Path, version: object, own: bool) -> str:
    """What to do about an unusable wheel: only the tool's own download may be removed;
    a file the user named is theirs, whatever it holds."""
    if own:
        return (f"it is this tool's own download (its cache): remove it, rm {path}, and rerun: "
                f"python -m torch_fork_overlay wheel --version {version}")
    return (f"pass an official torch wheel instead: --wheel /path/to/torch-{version}-<tags>.whl, "
            f"or let the tool download it: python -m torch_fork_overlay wheel --version {version}")


def _bad_wheel(path: Path, detail: str, cause: str, version: object = "<release>",
               own: bool = False) -> OverlayError:
    return OverlayError(
        f"{path} is not a usable official torch wheel: {detail}",
        cause=cause,
        next=_next_wheel(path, version, own),
    )


def _hasher(zf: zipfile.ZipFile, path: Path, version: object, own: bool):
    """sha256 of a member of the wheel, read without unpacking it."""
    names = set(zf.namelist())

    def sha(rel: str) -> str | None:
        if rel not in names:
            return None
        try:
            return st.sha256_bytes(zf.read(rel))
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise _bad_wheel(path, f"cannot read {rel} ({e})",
                             "the download was truncated or the file is corrupt", version, own) from None

    return sha


def _local_of(unpacked: Path, dist_info: Path) -> tuple[str, str | None]:
    meta = (dist_info / "METADATA").read_text(encoding="utf-8")
    m = re.search(r"^Version: (\S+)$", meta, re.M)
    mver = Version(m.group(1)) if m else None
    vpy = (unpacked / "torch" / "version.py").read_text(encoding="utf-8")
    vm = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", vpy, re.M)
    pver = Version(vm.group(1)) if vm else None
    local = (mver and mver.local) or (pver and pver.local)
    return (mver or pver).base_version, local


def _remove_stale_temp_dirs(out_dir: Path) -> None:
    """Temp dirs of wheel runs that were SIGKILLed: their pid is gone."""
    for d in sorted(out_dir.glob("tfo-wheel-*-*")):
        m = re.fullmatch(r"tfo-wheel-(\d+)-\w+", d.name)
        if not m or not d.is_dir():
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # that run is still going (or the pid was reused: leave it)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        print(f"removing {d}: left by a wheel run (pid {m.group(1)}) that was killed")
        shutil.rmtree(d, ignore_errors=True)


def build_wheel(
    *,
    version: str | None = None,
    wheel_path: str | os.PathLike[str] | None = None,
    out_dir: str | os.PathLike[str],
    label: str = DEFAULT_LABEL,
    patches_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Build ``<out_dir>/torch-<version>+<local>.<label>-<tags>.whl``.

    Give the official wheel by ``wheel_path``, or a ``version`` to fetch with
    pip. Returns the path of the new wheel.
    """
    if (version is None) == (wheel_path is None):
        raise OverlayError(
            "build_wheel needs exactly one of --version and --wheel",
            cause="both or neither were given",
            next="python -m torch_fork_overlay wheel --version 2.15.0",
        )
    try:
        Version(f"1+{label}")
        assert "-" not in label and "+" not in label
    except (InvalidVersion, AssertionError):
        raise OverlayError(
            f"{label!r} is not a valid local version label",
            cause="labels are dot-separated letters and digits (PEP 440)",
            next="pass e.g. --label fakemode.1",
        ) from None
    t_all = time.monotonic()
    downloaded = False
    own = wheel_path is None  # the tool's own download: the only wheel its errors may say to remove
    if wheel_path is None:
        # fail fast before downloading when no series can serve it
        root, supported = patches_root(patches_dir), supported_versions(patches_dir)
        if own_release(version, root) is None:
            if not supported:
                raise refusal(version, what=f"torch {version}", root=root, supported=supported)
            print(f"no folder v{base_version(version)} in {root}: downloading torch {version} first, "
                  "to compare the files each supported series touches with their sha256 "
                  f"(supported: {', '.join(supported)})")
            downloaded = True
        with timed(f"fetching torch {version} with pip download"):
            wheel_path = download_wheel(
                version=version, cache_dir=Path(cache_dir) if cache_dir else default_cache_dir()
            )
    wheel_path = Path(wheel_path)
    if not wheel_path.is_file():
        raise OverlayError(
            f"wheel file {wheel_path} does not exist",
            cause="the path is mistyped",
            next="pass an existing file, or let the tool fetch it: --version <release>",
        )
    newest = (supported_versions(patches_dir) or ["<release>"])[-1]
    try:
        name, wver, _build, _tags = parse_wheel_filename(wheel_path.name)
    except (InvalidWheelFilename, InvalidVersion) as e:
        raise _bad_wheel(wheel_path, f"bad file name ({e})", "it is not a wheel file: a wrong path was passed",
                         newest, own) from None
    if name != "torch":
        raise _bad_wheel(wheel_path, f"it is a wheel of {name!r}, not torch",
                         "the wrong file was passed", newest, own)
    if not zipfile.is_zipfile(wheel_path):
        raise _bad_wheel(wheel_path, "it is not a zip archive",
                         "the download was truncated or the file is corrupt", wver, own)
    what = f"torch {wver} ({wheel_path})"
    if downloaded:
        what = (f"torch {wver} (downloaded first to {wheel_path}: without a folder "
                f"v{base_version(str(wver))}, only its files' sha256 can tell which series serves it)")
    with zipfile.ZipFile(wheel_path) as zf:
        serving = find_serving(str(wver), hash_of=_hasher(zf, wheel_path, wver, own), what=what,
                               patches_dir=patches_dir)
    series = serving.series
    if not serving.own and serving.match != "none":
        print(f"torch {wver}: served by {serving.describe()}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_temp_dirs(out_dir)
    # Ctrl-C / SIGTERM: proc.run stops the child's process group, then this
    # removes the temp dir (~1.2 GB for the official wheel); after a SIGKILL
    # the child dies too (PDEATHSIG) and the next run removes the dir.
    with tempfile.TemporaryDirectory(prefix=f"tfo-wheel-{os.getpid()}-", dir=out_dir) as tmp:
        tmp = Path(tmp)
        with timed(f"unpacking {wheel_path.name} (wheel unpack checks RECORD hashes)"):
            run([sys.executable, "-m", "wheel", "unpack", "-d", str(tmp), str(wheel_path)],
                what=f"wheel unpack failed on {wheel_path}",
                cause="the wheel is corrupt: a file does not match its RECORD hash, "
                "or the archive is damaged",
                next=_next_wheel(wheel_path, wver, own))
        (unpacked,) = [p for p in tmp.iterdir() if p.is_dir()]
        (dist_info,) = list(unpacked.glob("*.dist-info"))
        base, local = _local_of(unpacked, dist_info)
        wrong = [
            rel for rel, v in series.manifest.items()
            if st.sha256_file(unpacked / rel) != v["pristine"]
        ]
        if wrong:
            raise _bad_wheel(
                wheel_path,
                f"{', '.join(wrong)} differ from pristine torch {series.version}",
                "it is not an official build of that release (or was already patched)",
                wver, own,
            )
        with timed(f"applying the v{series.version} series"):
            applied = patch_tree(root=unpacked, series=series, include_tests=False)
        for rel, v in series.manifest.items():
            if st.sha256_file(unpacked / rel) != v["patched"]:
                raise OverlayError(
                    f"{rel} in the patched wheel does not match {series.dir / 'manifest.json'}",
                    cause="the manifest is stale",
                    next=f"python -m torch_fork_overlay refresh --manifest-only --version {series.version}",
                )
        new_local = f"{local}.{label}" if local else label
        new_version = f"{base}+{new_local}"
        vpy = unpacked / "torch" / "version.py"
        text = vpy.read_text(encoding="utf-8")
        text = re.sub(r"^(__version__\s*=\s*)['\"][^'\"]*['\"]", rf"\g<1>'{new_version}'",
                      text, count=1, flags=re.M)
        vpy.write_text(text, encoding="utf-8")
        with timed(f"packing torch {new_version} (wheel pack writes RECORD)"):
            run([sys.executable, "-m", "wheel", "pack", "--local-version", new_local,
                 "-d", str(tmp), str(unpacked)],
                what="wheel pack failed", cause="see the output above",
                next="pip install -U 'wheel>=0.48' and rerun")
        (built,) = list(tmp.glob("*.whl"))
        final = out_dir / built.name
        os.replace(built, final)
    print(f"built {final} from {wheel_path.name} with {', '.join(applied) or 'no patches'} "
          f"in {time.monotonic() - t_all:.1f}s\n  install with: pip install {final}")
    return final
