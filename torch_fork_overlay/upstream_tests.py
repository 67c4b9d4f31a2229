"""``upstream-tests``: run PyTorch's own test files on stock and patched torch.

Suites are data (``suites.toml`` next to this file, or ``--suites-file``):
files, an optional ``-k`` expression, a timeout, modules both interpreters
need, and deselections each with a reason.  Each suite runs once per
interpreter with pytest's junit-xml; the two results are compared per test:

* regression -- passed on stock, failed (or vanished) patched;
* fix        -- failed on stock, passed patched;
* both fail  -- failed on both (a pre-existing failure, not ours).

The checkout only provides the test files: pytest runs with ``cwd`` = the
checkout's ``test/`` folder so ``import torch`` and ``torch.testing._internal``
come from each interpreter's installed torch (checked before anything runs),
with ``PYTHONDONTWRITEBYTECODE=1`` and no pytest cache so the checkout is not
written to.  Logs, junit files and ``report.json`` go to ``--out-dir``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable

from . import proc
from .errors import OverlayError

ENV_STOCK = "TORCH_FORK_OVERLAY_STOCK_PYTHON"
ENV_PATCHED = "TORCH_FORK_OVERLAY_PATCHED_PYTHON"
SUITES_FILE = Path(__file__).with_name("suites.toml")
PROJECT_ROOT = Path(__file__).resolve().parent.parent
SIDES = ("stock", "patched")


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    description: str
    files: tuple[str, ...]
    timeout: int
    k: str | None = None
    requires: tuple[str, ...] = ("pytest",)
    deselect: tuple[tuple[str, str], ...] = ()  # (node id, reason)


@dataclasses.dataclass
class Run:
    side: str
    python: str
    returncode: int
    timed_out: bool
    seconds: float
    junit: Path
    log: Path
    outcomes: dict[str, str]  # test id -> passed | failed | skipped

    @property
    def complete(self) -> bool:
        # pytest: 0 all passed, 1 some failed, 5 none collected
        return not self.timed_out and self.returncode in (0, 1, 5) and self.junit.is_file()

    def counts(self) -> dict[str, int]:
        c = {"passed": 0, "failed": 0, "skipped": 0}
        for o in self.outcomes.values():
            c[o] += 1
        return c


@dataclasses.dataclass
class SuiteReport:
    suite: Suite
    stock: Run
    patched: Run
    regressions: list[str]
    fixes: list[str]
    both_fail: list[str]
    both_pass: int
    skipped: int
    only_patched: list[str]

    @property
    def ok(self) -> bool:
        return not self.regressions and self.stock.complete and self.patched.complete


def load_suites(path: str | os.PathLike[str] | None = None) -> dict[str, Suite]:
    path = Path(path) if path else SUITES_FILE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        out = {}
        for name, s in data["suites"].items():
            desel = []
            for d in s.get("deselect", []):
                if not d.get("reason"):
                    raise ValueError(f"suite {name}: deselect {d.get('id')!r} has no reason")
                desel.append((d["id"], d["reason"]))
            out[name] = Suite(
                name=name,
                description=s.get("description", ""),
                files=tuple(s["files"]),
                timeout=int(s["timeout"]),
                k=s.get("k"),
                requires=tuple(s.get("requires", ["pytest"])),
                deselect=tuple(desel),
            )
        return out
    except (OSError, ValueError, KeyError, TypeError, tomllib.TOMLDecodeError) as e:
        raise OverlayError(
            f"suites file {path} is not valid ({type(e).__name__}: {e})",
            cause="it was edited by hand and lost a field (files, timeout) or a deselect reason",
            next=f"fix {path}; its header comment lists the fields",
        ) from None


def default_python(side: str) -> str:
    env = os.environ.get(ENV_STOCK if side == "stock" else ENV_PATCHED)
    if env:
        return env
    return str(PROJECT_ROOT / (".venv-stock" if side == "stock" else ".venv") / "bin" / "python")


# --- junit -------------------------------------------------------------------


def parse_junit(path: Path) -> dict[str, str]:
    """{node id: passed | failed | skipped} from a pytest junit-xml (xunit1) file.

    Node ids read like pytest's: ``test/dynamo/test_misc.py::MiscTests::test_x``.
    """
    root = ET.parse(path).getroot()
    out = {}
    for tc in root.iter("testcase"):
        key = _node_id(tc.get("file"), tc.get("classname", ""), tc.get("name", ""))
        tags = {child.tag for child in tc}
        # a teardown error after a pass is a second <testcase>: failed wins
        if out.get(key) != "failed":
            out[key] = ("failed" if tags & {"failure", "error"}
                        else "skipped" if "skipped" in tags else "passed")
    return out


def _node_id(file: str | None, classname: str, name: str) -> str:
    if not file:
        return f"{classname}::{name}"
    module = file[:-3].replace("/", ".") if file.endswith(".py") else file
    if classname.startswith(module + "."):
        return f"{file}::{classname[len(module) + 1:]}::{name}"
    return f"{file}::{name}"


def compare(suite: Suite, stock: Run, patched: Run) -> SuiteReport:
    """Classify every test id seen on either side; no status change goes unreported.

    A test that does not pass on the patched side although it did not fail on stock
    (passed, or skipped there) is a regression; one that fails on stock and passes
    patched is a fix. A test missing on one side crashed, timed out or was not collected.
    """
    s, p = stock.outcomes, patched.outcomes
    regressions, fixes, both_fail, only_patched = [], [], [], []
    both_pass = skipped = 0
    for key in sorted(set(s) | set(p)):
        a, b = s.get(key), p.get(key)
        if a == b == "passed":
            both_pass += 1
        elif a == b == "skipped":
            skipped += 1
        elif a is None:
            only_patched.append(f"{key} ({b})")
        elif b == "passed":
            # failed -> passed is a fix; skipped -> passed changes nothing we judge
            if a == "failed":
                fixes.append(key)
            else:
                skipped += 1
        elif a == "failed":
            both_fail.append(key if b == "failed" else f"{key}  ({_patched_status(b)})")
        else:
            # passed or skipped on stock; failed, skipped or missing on patched
            regressions.append(key if (a, b) == ("passed", "failed")
                               else f"{key}  ({a} on stock, {_patched_status(b)})")
    return SuiteReport(suite, stock, patched, regressions, fixes, both_fail, both_pass, skipped, only_patched)


def _patched_status(outcome: str | None) -> str:
    if outcome is None:
        return "missing on patched: crashed, timed out or not collected"
    return f"{outcome} on patched"


# --- running -------------------------------------------------------------------

_PROBE = r"""
import importlib.util, json, os, sys
mods = json.loads(sys.argv[1])
info = {"missing": [m for m in mods if importlib.util.find_spec(m) is None], "executable": sys.executable}
if "torch" in mods and not info["missing"]:
    import torch
    info["torch"] = torch.__version__
    info["torch_file"] = os.path.realpath(torch.__file__)
print(json.dumps(info))
"""


def _probe(python: str, side: str, src: Path, requires: set[str]) -> dict:
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        env = ENV_STOCK if side == "stock" else ENV_PATCHED
        raise OverlayError(
            f"the {side} interpreter {python} does not exist or is not executable",
            cause="the virtual environment was not created yet, or the path is wrong",
            next=("create it with the README's first command (tools/bootstrap), or pass "
                  f"--{side}-python PATH (or set {env})"),
        )
    cp = proc.run([python, "-c", _PROBE, json.dumps(sorted(requires))], cwd=src / "test",
                  env={"PYTHONDONTWRITEBYTECODE": "1"},
                  what=f"could not probe the {side} interpreter {python}")
    info = json.loads(cp.stdout.strip().splitlines()[-1])
    if info["missing"]:
        raise OverlayError(
            f"the {side} interpreter {python} cannot import {', '.join(info['missing'])}",
            cause="PyTorch's tests need numpy, pytest, expecttest and hypothesis besides torch",
            next=f"{python} -m pip install {' '.join(m for m in info['missing'] if m != 'torch') or 'torch'}",
        )
    tf = info.get("torch_file")
    if tf and Path(tf).is_relative_to(src):
        raise OverlayError(
            f"the {side} interpreter imports torch from the checkout ({tf}), not an installed torch",
            cause="PYTHONPATH or an editable install points at the PyTorch checkout",
            next=f"unset PYTHONPATH, or pass --{side}-python of a venv with torch installed from a wheel",
        )
    return info


def run_suite(*, suite: Suite, src: Path, python: str, side: str, out_dir: Path) -> Run:
    junit = out_dir / f"{suite.name}-{side}.xml"
    log = out_dir / f"{suite.name}-{side}.log"
    junit.unlink(missing_ok=True)
    cmd = [python, "-m", "pytest", *[os.path.relpath(src / f, src / "test") for f in suite.files],
           f"--rootdir={src}", "-p", "no:cacheprovider", "-p", "no:benchmark", "-q", "-o", "junit_family=xunit1",
           f"--junitxml={junit}"]
    if suite.k:
        cmd += ["-k", suite.k]
    for node, _reason in suite.deselect:
        cmd += ["--deselect", node]
    timeout = shutil.which("timeout")
    full = ([timeout, "--kill-after=30", str(suite.timeout)] if timeout else []) + cmd
    t0 = time.monotonic()
    cp = proc.run(full, cwd=src / "test", check=False, env={"PYTHONDONTWRITEBYTECODE": "1"})
    secs = time.monotonic() - t0
    log.write_text(f"$ cd {src / 'test'} && {' '.join(full)}\n# exit status {cp.returncode}\n"
                   f"{cp.stdout}\n--- stderr ---\n{cp.stderr}", encoding="utf-8")
    timed_out = bool(timeout) and cp.returncode in (124, 137)
    outcomes = parse_junit(junit) if junit.is_file() else {}
    return Run(side, python, cp.returncode, timed_out, secs, junit, log, outcomes)


def upstream_tests(
    *,
    pytorch_src: str | os.PathLike[str],
    suites: list[str] | None = None,
    stock_python: str | None = None,
    patched_python: str | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    suites_file: str | os.PathLike[str] | None = None,
    echo: Callable[[str], None] = print,
) -> list[SuiteReport]:
    """Run the named suites (default: all) on both interpreters; return the reports."""
    src = Path(pytorch_src).resolve()
    if not (src / "test").is_dir():
        raise OverlayError(
            f"--pytorch-src {pytorch_src} has no test/ folder",
            cause="upstream-tests needs a PyTorch source checkout (its test files are not in the wheel "
            "and this project does not copy them)",
            next="git clone https://github.com/pytorch/pytorch && git -C pytorch checkout v2.15.0 && "
            "python -m torch_fork_overlay upstream-tests --pytorch-src pytorch",
        )
    known = load_suites(suites_file)
    names = list(suites or known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise OverlayError(
            f"no suite named {', '.join(unknown)}",
            cause=f"the suites are: {', '.join(known)}",
            next="python -m torch_fork_overlay upstream-tests --list",
        )
    chosen = [known[n] for n in names]
    missing = [f for s in chosen for f in s.files if not (src / f).is_file()]
    if missing:
        raise OverlayError(
            f"{src} lacks test file(s) {', '.join(sorted(set(missing)))}",
            cause="the checkout is another PyTorch version, where those files moved or do not exist",
            next=f"git -C {src} checkout v2.15.0, or choose other suites (--list)",
        )
    pythons = {"stock": stock_python or default_python("stock"),
               "patched": patched_python or default_python("patched")}
    requires = {m for s in chosen for m in s.requires}
    infos = {side: _probe(pythons[side], side, src, requires) for side in SIDES}
    tf = {side: infos[side].get("torch_file") for side in SIDES}
    if tf["stock"] and tf["stock"] == tf["patched"]:
        echo(f"warning: both interpreters import the same torch ({tf['stock']}); "
             "the comparison can show no difference")
    out = Path(out_dir) if out_dir else PROJECT_ROOT / "build" / "upstream-tests"
    out.mkdir(parents=True, exist_ok=True)

    reports = []
    for suite in chosen:
        runs = {}
        for side in SIDES:
            tv = f" (torch {infos[side]['torch']})" if "torch" in infos[side] else ""
            echo(f"== {suite.name} [{side}] {pythons[side]}{tv}: {len(suite.files)} file(s)"
                 + (f", -k {suite.k!r}" if suite.k else "")
                 + (f", {len(suite.deselect)} deselected" if suite.deselect else "")
                 + f", timeout {suite.timeout}s")
            r = runs[side] = run_suite(suite=suite, src=src, python=pythons[side], side=side, out_dir=out)
            c = r.counts()
            state = ("TIMED OUT" if r.timed_out else
                     f"pytest exit {r.returncode}" + ("" if r.complete else " (INCOMPLETE)"))
            echo(f"   {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped in "
                 f"{r.seconds:.1f}s; {state}; log {r.log}")
        reports.append(compare(suite, runs["stock"], runs["patched"]))
    _write_json(out / "report.json", reports, pythons, infos)
    echo(format_reports(reports))
    echo(f"junit files, logs and report.json are in {out}")
    return reports


def format_reports(reports: list[SuiteReport]) -> str:
    lines = []
    for r in reports:
        lines.append(f"{r.suite.name}: {len(r.regressions)} regression(s), {len(r.fixes)} fix(es), "
                     f"{len(r.both_fail)} failing on both, {r.both_pass} passing on both, {r.skipped} skipped")
        for title, items in (("regressions (pass on stock, fail patched)", r.regressions),
                             ("fixes (fail on stock, pass patched)", r.fixes),
                             ("failing on both (not caused by the patch)", r.both_fail),
                             ("only on patched", r.only_patched)):
            if items:
                lines.append(f"  {title}:")
                lines += [f"    {i}" for i in items]
        for side in SIDES:
            run = getattr(r, side)
            if not run.complete:
                lines.append(f"  {side} run did not complete ("
                             + ("timed out" if run.timed_out else f"pytest exit {run.returncode}")
                             + f"): see {run.log}")
        for node, reason in r.suite.deselect:
            lines.append(f"  deselected {node}: {reason}")
    total = sum(len(r.regressions) for r in reports)
    bad = [r.suite.name for r in reports if not (r.stock.complete and r.patched.complete)]
    lines.append(f"summary: {len(reports)} suite(s), {total} regression(s), "
                 f"{sum(len(r.fixes) for r in reports)} fix(es)"
                 + (f"; incomplete: {', '.join(bad)}" if bad else ""))
    return "\n".join(lines)


def _write_json(path: Path, reports, pythons, infos) -> None:
    data = {
        "interpreters": {s: {"python": pythons[s], **infos[s]} for s in SIDES},
        "suites": {
            r.suite.name: {
                "regressions": r.regressions, "fixes": r.fixes, "both_fail": r.both_fail,
                "both_pass": r.both_pass, "skipped": r.skipped, "only_patched": r.only_patched,
                "deselected": [{"id": n, "reason": why} for n, why in r.suite.deselect],
                **{s: {"returncode": getattr(r, s).returncode, "timed_out": getattr(r, s).timed_out,
                       "seconds": round(getattr(r, s).seconds, 1), "junit": str(getattr(r, s).junit),
                       "log": str(getattr(r, s).log), **getattr(r, s).counts()} for s in SIDES},
            }
            for r in reports
        },
    }
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def exit_status(reports: list[SuiteReport]) -> int:
    """0 when every suite ran to completion on both sides without regressions."""
    return 0 if all(r.ok for r in reports) else 1
