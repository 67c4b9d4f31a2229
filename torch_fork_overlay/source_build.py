"""``source-build``: build PyTorch from a checkout with the series applied.

Called by ``CMakeLists.txt`` (``--check-only`` at configure time, the full
run from the ``torch_wheel`` target) and usable on its own.  Steps:

1. check the checkout: repository root with ``setup.py`` and ``version.txt``;
   a series that serves it (``releases``: its own folder, or one whose
   manifest finds the touched files byte-identical); every touched file
   pristine or already patched (manifest sha256); git submodules populated; for ``--use-cuda ON`` an
   ``nvcc``; for a real build, PyTorch's build requirements importable;
2. apply the series with ``apply.patch_tree`` (the one apply implementation),
   tests included, through a staging copy of the touched files so a failure
   leaves the checkout as it was; a checkout already patched is left alone;
3. run PyTorch's own build, ``python -m pip wheel . --no-build-isolation
   --no-deps`` (setup.py through pip, as PyTorch's README documents for 2.x),
   with ``PYTORCH_BUILD_VERSION=<release>+<label>`` (the checkout's release,
   from ``version.txt``, even when a sibling release's series serves it), ``PYTORCH_BUILD_NUMBER``,
   ``USE_CUDA``, ``MAX_JOBS`` and the caller's ``CMAKE_*`` environment.

With ``--dry-run`` (or ``TORCH_FORK_OVERLAY_DRY_RUN=1``) step 3 prints the exact
command, working directory and environment instead of running it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from packaging.version import InvalidVersion, Version

from . import checkout as co
from . import proc
from .apply import patch_tree
from .errors import OverlayError
from .releases import file_hasher, find_serving
from .series import Series, supported_versions

ENV_DRY_RUN = "TORCH_FORK_OVERLAY_DRY_RUN"
#: The caller's environment reaches PyTorch's build unchanged; these variables
#: (PyTorch's setup.py options and toolchain settings) are also shown in the plan.
SHOWN_PREFIXES = ("CMAKE_", "BUILD_", "USE_", "CUDNN_", "NCCL_")
SHOWN_NAMES = ("TORCH_CUDA_ARCH_LIST", "BLAS", "CC", "CXX", "CFLAGS", "CXXFLAGS", "LDFLAGS", "DEBUG",
               "REL_WITH_DEB_INFO", "CUDA_HOME", "CUDAToolkit_ROOT", "CUDACXX")
#: Used when the checkout has no requirements-build.txt (distribution names).
FALLBACK_BUILD_REQUIREMENTS = ("setuptools", "pyyaml", "typing-extensions", "numpy", "cmake", "ninja")


@dataclasses.dataclass
class BuildPlan:
    src: Path
    series: Series
    state: str  # the touched files before this run: "pristine" | "patched"
    release: str  # the checkout's release (version.txt), e.g. "2.15.0"
    command: list[str]
    env: dict[str, str]  # added to the caller's environment
    dist_dir: Path
    cuda: tuple[str, str] | None = None  # (toolkit root, nvcc version)
    wheel: Path | None = None  # set after a real build

    def describe(self) -> str:
        env = "\n".join(f"  {k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (f"cwd: {self.src}\nenvironment (set here, or inherited and relevant; the rest is inherited as is):\n{env}\n"
                f"command:\n  {shlex.join(self.command)}")


# --- checks ------------------------------------------------------------------


def check_checkout(*, pytorch_src, patches_dir=None) -> tuple[Path, Series, str, str]:
    """Return (root, series, "pristine" | "patched", release); raise if the checkout does not match."""
    src = co.require_source_dir(pytorch_src, command="source-build")
    if not (src / "setup.py").is_file():
        raise OverlayError(
            f"{src} has no setup.py",
            cause="--pytorch-src must be the root of a PyTorch checkout",
            next="python -m torch_fork_overlay source-build --pytorch-src <the folder with setup.py>",
        )
    v = co.read_version(src)
    supported = supported_versions(patches_dir)
    serving = find_serving(
        v.raw, hash_of=file_hasher(src), what=f"{src}, torch {v.raw} (version.txt)", patches_dir=patches_dir,
        next=(f"git -C {src} checkout v{supported[-1]} && git -C {src} submodule update --init --recursive, "
              "then rerun" if supported else None),
    )
    state = co.require_matching_files(src, serving.series, allow_patched=True, command="source-build")
    return src, serving.series, state, v.base


def check_submodules(src: Path) -> None:
    gm = src / ".gitmodules"
    if not gm.is_file():
        return
    paths = re.findall(r"^\s*path\s*=\s*(.+?)\s*$", gm.read_text(encoding="utf-8"), re.M)
    empty = [p for p in paths if not (src / p).is_dir() or not any((src / p).iterdir())]
    if empty:
        raise OverlayError(
            f"{src} has {len(empty)} git submodule(s) not checked out: {', '.join(empty[:5])}"
            + (" ..." if len(empty) > 5 else ""),
            cause="the checkout was cloned without --recursive",
            next=f"git -C {src} submodule sync && git -C {src} submodule update --init --recursive",
        )


def find_cuda(cuda_home: str | None = None) -> tuple[str, str]:
    """(toolkit root, nvcc release) from --cuda-home / $CUDA_HOME, else PATH, else /usr/local/cuda.

    When a root is named, nvcc must be in its bin/: a build silently picking
    another toolkit is worse than an error.
    """
    root = cuda_home or os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if root:
        nvcc = Path(root) / "bin" / "nvcc"
        where = f"{nvcc} (from {'--cuda-home, i.e. -DCUDAToolkit_ROOT' if cuda_home else '$CUDA_HOME'})"
        nvcc = str(nvcc) if nvcc.is_file() else None
    else:
        nvcc = shutil.which("nvcc") or (
            "/usr/local/cuda/bin/nvcc" if os.path.isfile("/usr/local/cuda/bin/nvcc") else None)
        where = "PATH and /usr/local/cuda/bin"
    if not nvcc:
        raise OverlayError(
            f"USE_CUDA=ON but there is no nvcc at {where}",
            cause="the CUDA toolkit is not installed, or CUDA_HOME / CUDAToolkit_ROOT names the wrong folder",
            next="install the CUDA toolkit and pass its root (-DCUDAToolkit_ROOT=/usr/local/cuda-13.0, "
            "or --cuda-home), or build for the CPU: -DUSE_CUDA=OFF",
        )
    out = proc.run([nvcc, "--version"], what=f"{nvcc} --version failed").stdout
    m = re.search(r"release (\d+\.\d+)", out)
    # nvcc on PATH may be a wrapper script; nvcc itself says where it lives.
    dry = proc.run([nvcc, "--dryrun", "-c", "probe.cu"], cwd=tempfile.gettempdir(), check=False)
    here = re.search(r"^#\$ _HERE_=(.+)$", dry.stdout + dry.stderr, re.M)
    root = Path(here.group(1).strip()).resolve().parent if here else Path(nvcc).resolve().parent.parent
    if not (root / "include" / "cuda_runtime.h").is_file():
        raise OverlayError(
            f"USE_CUDA=ON: {nvcc} belongs to {root}, which has no include/cuda_runtime.h",
            cause="an incomplete CUDA toolkit (the compiler without the development headers)",
            next="install the full CUDA toolkit and pass its root (-DCUDAToolkit_ROOT= or --cuda-home), "
            "or build for the CPU: -DUSE_CUDA=OFF",
        )
    return str(root), (m.group(1) if m else "unknown")


def check_cuda(*, cuda_home: str | None = None, echo: Callable[[str], None] = print) -> tuple[str, str]:
    root, version = find_cuda(cuda_home)
    echo(f"source-build: CUDA toolkit {version} at {root}")
    return root, version


def check_build_requirements(src: Path, python: str) -> None:
    req = src / "requirements-build.txt"
    names = list(FALLBACK_BUILD_REQUIREMENTS)
    if req.is_file():
        names = [re.split(r"[\s<>=!~;\[]", l.strip(), maxsplit=1)[0]
                 for l in req.read_text(encoding="utf-8").splitlines()
                 if l.strip() and not l.lstrip().startswith(("#", "-"))]
    probe = ("import importlib.metadata as m, json, sys\n"
             "def has(n):\n    try:\n        m.version(n); return True\n"
             "    except m.PackageNotFoundError:\n        return False\n"
             "print(json.dumps([n for n in json.loads(sys.argv[1]) if not has(n)]))")
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise OverlayError(
            f"the build interpreter {python} does not exist",
            cause="the path is wrong or the virtual environment was removed",
            next="pass --python (or -DPython3_EXECUTABLE=) of the environment that builds PyTorch",
        )
    missing = json.loads(proc.run([python, "-c", probe, json.dumps(names)]).stdout)
    if missing:
        raise OverlayError(
            f"the build interpreter {python} lacks PyTorch's build requirements: {', '.join(missing)}",
            cause="PyTorch's build requirements were not installed into it",
            next=f"{python} -m pip install -r {src / ('requirements-build.txt' if req.is_file() else 'requirements.txt')}",
        )


# --- apply ---------------------------------------------------------------------


def apply_series(src: Path, series: Series, state: str, echo: Callable[[str], None]) -> None:
    """Apply ``series`` (tests included) to ``src`` via a staging copy."""
    if state == "patched":
        echo(f"source-build: the v{series.version} series is already applied to {src}; leaving it")
        return
    files = sorted({f for p in series.patches for f in p.files})
    with tempfile.TemporaryDirectory(prefix="tfo-source-build-") as tmp:
        stage = Path(tmp)
        for rel in files:
            if (src / rel).is_file():
                (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / rel, stage / rel)
        applied = patch_tree(root=stage, series=series, include_tests=True)
        bad = [rel for rel, h in series.manifest.items() if co.sha256(stage / rel) != h.get("patched")]
        if bad:
            raise OverlayError(
                f"applying the v{series.version} series gave files whose sha256 differs from the manifest: "
                f"{', '.join(bad)}",
                cause="the manifest is stale or a patch was edited by hand",
                next=f"python -m torch_fork_overlay refresh --manifest-only --version {series.version}",
            )
        for rel in files:
            if (stage / rel).is_file():
                (src / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(stage / rel, src / rel)
    new = sorted({f for p in series.patches for f in p.new_files})
    changed = [f for f in files if f not in new]
    echo(f"source-build: applied {', '.join(applied)} to {src}\n"
         f"  undo with: git -C {src} checkout -- {' '.join(changed)}"
         + (f" && rm -f {' '.join(str(src / f) for f in new)}" if new else ""))


# --- plan and build ------------------------------------------------------------


def make_plan(*, src: Path, series: Series, state: str, use_cuda: bool, max_jobs: int | None,
              label: str, build_number: str, python: str, cuda: tuple[str, str] | None,
              dist_dir: Path, release: str | None = None) -> BuildPlan:
    release = release or series.version
    version = f"{release}+{label}"
    try:
        if Version(version).local != label.lower():
            raise InvalidVersion(version)
    except InvalidVersion:
        raise OverlayError(
            f"--label {label!r} does not make a valid local version ({version})",
            cause="a local version label is letters, digits and dots (PEP 440)",
            next="pass e.g. --label fakemode.1 (or -DOVERLAY_LABEL=fakemode.1)",
        ) from None
    env = {k: v for k, v in os.environ.items() if k.startswith(SHOWN_PREFIXES) or k in SHOWN_NAMES}
    env.update({
        "PYTORCH_BUILD_VERSION": version,
        "PYTORCH_BUILD_NUMBER": str(build_number),
        "USE_CUDA": "1" if use_cuda else "0",
    })
    env.setdefault("BUILD_TEST", "0")  # C++ test binaries are not part of a wheel
    if not use_cuda:
        env.update({"USE_ROCM": "0", "USE_XPU": "0"})  # a CPU build even where they are installed
    if max_jobs:
        env["MAX_JOBS"] = str(max_jobs)
    if cuda:
        env["CUDA_HOME"] = env["CUDAToolkit_ROOT"] = cuda[0]
        env["CUDACXX"] = str(Path(cuda[0]) / "bin" / "nvcc")
    command = [python, "-m", "pip", "wheel", ".", "--no-build-isolation", "--no-deps", "-v",
               "-w", str(dist_dir)]
    return BuildPlan(src=src, series=series, state=state, release=release, command=command, env=env,
                     dist_dir=dist_dir, cuda=cuda)


def source_build(
    *,
    pytorch_src: str | os.PathLike[str],
    use_cuda: bool = False,
    max_jobs: int | None = None,
    label: str = "fakemode.1",
    build_number: str = "1",
    python: str | None = None,
    cuda_home: str | None = None,
    dist_dir: str | os.PathLike[str] = "dist",
    dry_run: bool | None = None,
    check_only: bool = False,
    patches_dir: str | os.PathLike[str] | None = None,
    echo: Callable[[str], None] = print,
) -> BuildPlan:
    """Check, apply and build; see the module docstring."""
    if dry_run is None:
        dry_run = os.environ.get(ENV_DRY_RUN, "") not in ("", "0")
    python = python or sys.executable
    src, series, state, release = check_checkout(pytorch_src=pytorch_src, patches_dir=patches_dir)
    check_submodules(src)
    cuda = find_cuda(cuda_home) if use_cuda else None
    plan = make_plan(src=src, series=series, state=state, use_cuda=use_cuda, max_jobs=max_jobs,
                     label=label, build_number=build_number, python=python, cuda=cuda,
                     dist_dir=Path(dist_dir).resolve(), release=release)
    served = "" if release == series.version else ", which serves it: touched files identical"
    echo(f"source-build: {src} is torch {release} ({state}); series v{series.version}{served} "
         f"({len(series.patches)} patch(es)); backend {'CUDA ' + cuda[1] + ' at ' + cuda[0] if cuda else 'CPU'}; "
         f"wheel version {plan.env['PYTORCH_BUILD_VERSION']}")
    if check_only:
        return plan
    if not dry_run:
        check_build_requirements(src, python)
    apply_series(src, series, state, echo)
    if dry_run:
        echo("source-build: dry run; the build would run as:\n" + plan.describe())
        return plan

    plan.dist_dir.mkdir(parents=True, exist_ok=True)
    log = plan.dist_dir / f"torch-{plan.env['PYTORCH_BUILD_VERSION']}-build.log"
    echo(f"==> building PyTorch (hours on a laptop; follow it with: tail -f {log})\n" + plan.describe())
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write(plan.describe() + "\n\n")
    # proc.run captures output in memory; an hours-long build goes to the log file instead.
    cp = proc.run(["sh", "-c", 'exec "$@" >>"$TFO_BUILD_LOG" 2>&1', "sh", *plan.command],
                  cwd=src, env={**plan.env, "TFO_BUILD_LOG": str(log)}, check=False)
    mins = (time.monotonic() - t0) / 60
    if cp.returncode != 0:
        tail = "\n".join("    " + l for l in log.read_text(errors="replace").splitlines()[-20:])
        raise OverlayError(
            f"PyTorch's build failed after {mins:.1f} min (exit status {cp.returncode})\n{tail}\n"
            f"  full log: {log}",
            cause="see the log: usually a missing toolchain piece (compiler, CUDA, submodule) or too little RAM "
            "for MAX_JOBS parallel compiles",
            next="fix the cause, then rerun the same command (the patches stay applied; the build resumes); "
            "docs/source-build.md lists what a build needs",
        )
    wheels = sorted(plan.dist_dir.glob(f"torch-{plan.env['PYTORCH_BUILD_VERSION']}-*.whl"))
    if not wheels:
        raise OverlayError(
            f"PyTorch's build succeeded but left no torch-{plan.env['PYTORCH_BUILD_VERSION']}-*.whl in "
            f"{plan.dist_dir}",
            cause="the build ignored PYTORCH_BUILD_VERSION or wrote elsewhere",
            next=f"read {log}",
        )
    plan.wheel = wheels[-1]
    echo(f"==> built {plan.wheel} in {mins:.1f} min; install it with: python -m pip install {plan.wheel}")
    return plan
