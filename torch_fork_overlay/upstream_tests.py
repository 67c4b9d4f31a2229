"""``upstream-tests``: run PyTorch's own test files on stock and patched torch.

Suites are data (``suites.toml`` next to this file, or ``--suites-file``):
files, an optional ``-k`` expression, a timeout, modules both interpreters
need, deselections and files expected not to run, each with a reason.  Each
suite runs once per interpreter with pytest; a small plugin (``_PLUGIN``)
streams every test's outcome and first error line to a file as it happens, so
a run killed by a timeout or a segfault still says what finished and which
test was running.  ``upstream_report`` compares the two runs and renders the
report (regressions, suspected regressions, fixes, files that did not really run).

The checkout only provides the test files: pytest runs with ``cwd`` = the
checkout's ``test/`` folder so ``import torch`` and ``torch.testing._internal``
come from each interpreter's installed torch (checked before anything runs),
with ``PYTHONDONTWRITEBYTECODE=1`` and no pytest cache so the checkout is not
written to.  Logs, junit files, outcome streams and ``report.json`` go to ``--out-dir``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import time
import tomllib
from pathlib import Path
from typing import Callable

from . import proc
from .errors import OverlayError
from .upstream_report import (
    SIDES,
    Outcome,
    Run,
    SuiteReport,
    compare,
    exit_reason,
    exit_status,
    format_reports,
    report_json,
)

ENV_STOCK = "TORCH_FORK_OVERLAY_STOCK_PYTHON"
ENV_PATCHED = "TORCH_FORK_OVERLAY_PATCHED_PYTHON"
SUITES_FILE = Path(__file__).with_name("suites.toml")
PROJECT_ROOT = Path(__file__).resolve().parent.parent
DOCS = "docs/upstream.md, \"Custom suites\""


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    description: str
    files: tuple[str, ...]
    timeout: int
    k: str | None = None
    requires: tuple[str, ...] = ("pytest",)
    deselect: tuple[tuple[str, str], ...] = ()  # (node id, reason)
    expect_not_running: tuple[tuple[str, str], ...] = ()  # (file, reason)


def _reasoned(name: str, s: dict, field: str, key: str) -> tuple[tuple[str, str], ...]:
    out = []
    for d in s.get(field, []):
        if not d.get("reason"):
            raise ValueError(f"suite {name}: {field} {d.get(key)!r} has no reason")
        out.append((d[key], d["reason"]))
    return tuple(out)


def load_suites(path: str | os.PathLike[str] | None = None) -> dict[str, Suite]:
    path = Path(path) if path else SUITES_FILE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        out = {}
        for name, s in data["suites"].items():
            unknown = set(s) - {f.name for f in dataclasses.fields(Suite)} - {"name"}
            if unknown:
                raise ValueError(f"suite {name}: unknown field(s) {', '.join(sorted(unknown))}")
            suite = out[name] = Suite(
                name=name,
                description=s.get("description", ""),
                files=tuple(s["files"]),
                timeout=int(s["timeout"]),
                k=s.get("k"),
                requires=tuple(s.get("requires", ["pytest"])),
                deselect=_reasoned(name, s, "deselect", "id"),
                expect_not_running=_reasoned(name, s, "expect_not_running", "file"),
            )
            stray = [f for f, _ in suite.expect_not_running if f not in suite.files]
            if stray:
                raise ValueError(f"suite {name}: expect_not_running names {', '.join(stray)}, not in its files")
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError, tomllib.TOMLDecodeError) as e:
        raise OverlayError(
            f"suites file {path} is not valid ({type(e).__name__}: {e})",
            cause="it was edited by hand and lost a field (files, timeout), a reason, or has a typo",
            next=f"fix {path}; the fields are listed in {DOCS} and in the shipped suites.toml's header",
        ) from None


def default_python(side: str) -> str:
    env = os.environ.get(ENV_STOCK if side == "stock" else ENV_PATCHED)
    if env:
        return env
    return str(PROJECT_ROOT / (".venv-stock" if side == "stock" else ".venv") / "bin" / "python")


# --- the outcome stream ---------------------------------------------------------

_PLUGIN = '''\
"""Written by torch-fork-overlay upstream-tests into its --out-dir; rewritten each run.

A pytest plugin (-p _tfo_outcomes) that appends one JSON line per test phase to
$TORCH_FORK_OVERLAY_OUTCOMES as it happens, so a run that is killed (timeout,
segfault) still says which tests finished and which one was running.
"""
import json
import os

_out = open(os.environ["TORCH_FORK_OVERLAY_OUTCOMES"], "a", encoding="utf-8")


def _write(**record):
    _out.write(json.dumps(record) + "\\n")
    _out.flush()


def _first_line(report):
    if getattr(report, "wasxfail", None) is not None:
        return ("xfail " + report.wasxfail).strip()
    longrepr = report.longrepr
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message  # "ExcType: message", as pytest's short summary shows it
    elif isinstance(longrepr, tuple) and len(longrepr) == 3:
        text = longrepr[2]  # a skip: (path, line, "Skipped: why")
    else:  # e.g. a collection error: pytest's text, with the exception on an "E   " line
        text = str(longrepr or "")
        text = next((line[1:] for line in text.splitlines() if line.startswith("E ")), text)
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def pytest_runtest_logstart(nodeid, location):
    _write(id=nodeid, when="start")


def pytest_runtest_logreport(report):
    message = "" if report.passed and not hasattr(report, "wasxfail") else _first_line(report)
    _write(id=report.nodeid, when=report.when, outcome=report.outcome, message=message)


def pytest_collectreport(report):
    if not report.passed:
        _write(id=report.nodeid, when="collect", outcome=report.outcome, message=_first_line(report))


def pytest_sessionfinish(session, exitstatus):
    _write(when="finish", exitstatus=int(exitstatus))
'''


def read_outcomes(path: Path, crashed: str) -> tuple[dict[str, Outcome], bool]:
    """{node id: Outcome} from the plugin's stream, and whether pytest finished its session.

    A test that started and has no teardown report was running when pytest died: it is
    ``crashed``, with ``crashed`` as its message. A failure in the test's call is ``failed``;
    in setup, teardown or collection (the id is then the file's or class's) ``errored``. Each
    phase is also counted as pytest's summary counts it: a call that fails and a teardown that
    then errors is 1 failed and 1 error (the teardown's line is kept next to the failure), a
    passing call with an erroring teardown 1 passed and 1 error.
    """
    phases: dict[str, list[dict]] = {}
    finished = False
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # the last line of a killed run may be cut short
        if rec.get("when") == "finish":
            finished = True
        elif "id" in rec:
            phases.setdefault(rec["id"], []).append(rec)
    return {key: _outcome(recs, crashed) for key, recs in phases.items()}, finished


def _counted(record: dict) -> str | None:
    """What pytest's summary counts for one phase: a failed call ``failed``, a failed setup,
    teardown or collection ``errored``, a skip ``skipped``, a passed call ``passed``; else nothing."""
    outcome = record.get("outcome")
    if outcome == "failed":
        return "failed" if record["when"] == "call" else "errored"
    if outcome == "skipped" or (outcome == "passed" and record["when"] == "call"):
        return outcome
    return None


def _outcome(records: list[dict], crashed: str) -> Outcome:
    if not {"teardown", "collect"} & {r["when"] for r in records}:
        return Outcome("crashed", crashed)
    counted = tuple(c for r in records if (c := _counted(r)))

    def outcome(status: str, message: str = "", teardown: str = "") -> Outcome:
        return Outcome(status, message, teardown, () if counted == (status,) else counted)

    failed = [r for r in records if r.get("outcome") == "failed"]
    if failed:
        first = failed[0]
        teardown = next((r.get("message", "") for r in failed[1:] if r["when"] == "teardown"), "")
        return outcome("failed" if first["when"] == "call" else "errored", first.get("message", ""), teardown)
    for r in records:
        if r.get("outcome") == "skipped":
            return outcome("skipped", r.get("message", ""))
    return outcome("passed")


# --- running -------------------------------------------------------------------

_PROBE = r"""
import importlib.util, json, os, sys, tempfile
mods = json.loads(sys.argv[1])
info = {"missing": [m for m in mods if importlib.util.find_spec(m) is None], "executable": sys.executable}
if "torch" in mods and not info["missing"]:
    import torch
    info["torch"] = torch.__version__
    info["torch_file"] = os.path.realpath(torch.__file__)
info["prefixes"] = sorted({sys.prefix, os.path.realpath(sys.prefix)})
info["tmpdirs"] = sorted({tempfile.gettempdir(), os.path.realpath(tempfile.gettempdir())})
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


def run_suite(*, suite: Suite, src: Path, python: str, side: str, out_dir: Path,
              prefixes: tuple[str, ...] = (), tmpdirs: tuple[str, ...] = ()) -> Run:
    out_dir = out_dir.resolve()  # pytest runs in the checkout: no path may be relative
    junit, log, stream = (out_dir / f"{suite.name}-{side}{ext}" for ext in (".xml", ".log", ".jsonl"))
    junit.unlink(missing_ok=True)
    stream.unlink(missing_ok=True)
    plugin_dir = out_dir / "pytest-plugin"
    plugin_dir.mkdir(parents=True, exist_ok=True)
    (plugin_dir / "_tfo_outcomes.py").write_text(_PLUGIN, encoding="utf-8")
    cmd = [python, "-m", "pytest", *[os.path.relpath(src / f, src / "test") for f in suite.files],
           f"--rootdir={src}", "-p", "_tfo_outcomes", "-p", "no:cacheprovider", "-p", "no:benchmark",
           "--continue-on-collection-errors", "-q", "-o", "junit_family=xunit1", f"--junitxml={junit}"]
    if suite.k:
        cmd += ["-k", suite.k]
    for node, _reason in suite.deselect:
        cmd += ["--deselect", node]
    timeout = shutil.which("timeout")
    full = ([timeout, "--kill-after=30", str(suite.timeout)] if timeout else []) + cmd
    # PYTHONHASHSEED: one set order on both sides, so a set in an error message compares equal
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "TORCH_FORK_OVERLAY_OUTCOMES": str(stream),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(plugin_dir), os.environ.get("PYTHONPATH")]))}
    t0 = time.monotonic()
    cp = proc.run(full, cwd=src / "test", check=False, env=env)
    secs = time.monotonic() - t0
    log.write_text(f"$ cd {shlex.quote(str(src / 'test'))} && "
                   + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + f" {shlex.join(full)}\n"
                   f"# exit status {cp.returncode}\n{cp.stdout}\n--- stderr ---\n{cp.stderr}", encoding="utf-8")
    timed_out = bool(timeout) and cp.returncode in (124, 137)
    crashed = f"pytest died while it ran ({exit_reason(cp.returncode, timed_out, suite.timeout)})"
    outcomes, finished = read_outcomes(stream, crashed)
    return Run(side, python, cp.returncode, timed_out, secs, log, outcomes, finished=finished,
               prefixes=prefixes, tmpdirs=tmpdirs, junit=junit)


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
    out = (Path(out_dir) if out_dir else PROJECT_ROOT / "build" / "upstream-tests").resolve()
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
            r = runs[side] = run_suite(suite=suite, src=src, python=pythons[side], side=side, out_dir=out,
                                       prefixes=tuple(infos[side].get("prefixes", ())),
                                       tmpdirs=tuple(infos[side].get("tmpdirs", ())))
            state = "complete" if r.complete else "INCOMPLETE: " + exit_reason(r.returncode, r.timed_out,
                                                                                suite.timeout)
            echo("   " + ", ".join(f"{n} {status}" for status, n in r.counts().items())
                 + f" in {r.seconds:.1f}s; pytest exit {r.returncode} ({state}); log {r.log}")
        reports.append(compare(suite, runs["stock"], runs["patched"]))
    data = {"exit_status": exit_status(reports),
            "interpreters": {s: {"python": pythons[s], **infos[s]} for s in SIDES},
            "suites": {r.suite.name: report_json(r) for r in reports}}
    (out / "report.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    echo(format_reports(reports))
    echo(f"junit files, outcome streams, logs and report.json are in {out}")
    return reports
