"""``upstream-tests`` end to end on a tiny checkout, with real pytest runs.

Both "interpreters" are the Python running these tests, behind two wrapper
scripts; the patched one sets TFO_TEST_SIDE=patched, which makes the synthetic
test files behave differently there (a regression, a fix, a failure that
changes, an import error, a segfault) -- so the classification is proven on
real pytest runs, not on mocks. Boundaries of the rules are unit tests of
``compare`` on hand-made outcomes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from torch_fork_overlay.errors import OverlayError
from torch_fork_overlay.upstream_report import (
    Outcome,
    Run,
    compare,
    format_report,
    format_reports,
    normalize,
    report_json,
)
from torch_fork_overlay.upstream_tests import (
    Suite,
    exit_status,
    load_suites,
    upstream_tests,
)

ALPHA = '''\
import os
import tempfile
import time
import pytest

PATCHED = os.environ.get("TFO_TEST_SIDE") == "patched"

def test_always():
    pass

def test_regresses():
    assert not PATCHED, "broken by the patch"

def test_fixed():
    assert PATCHED, "fixed by the patch"

def test_broken_everywhere():
    assert False

def test_skipped():
    pytest.skip("not here")

def test_known_broken():
    assert False

def test_slow():
    if os.environ.get("TFO_TEST_SLOW"):
        time.sleep(60)

def test_fails_differently():
    # like an expected graph that the patch changes: fails on both sides, not alike
    raise AssertionError("graph: " + ("opaque_region(x)" if PATCHED else "add(x, 1)"))

def test_fails_alike():
    # the same failure; its address, numbers and temp path differ on every run, a set's order
    # with the hash seed
    path = os.path.join(tempfile.gettempdir(), f"tfo{time.time_ns()}", "data.bin")
    keys = {"alpha", "beta", "gamma", "delta", "epsilon"}
    raise RuntimeError(f"{object()!r} with id {id(object())} cannot read {path}; keys {keys}")

@pytest.fixture
def device():
    if PATCHED:
        raise OSError("cannot open the device")

def test_errors_patched(device):
    pass
'''

BETA = '''\
import unittest

class BetaTests(unittest.TestCase):
    def test_selected(self):
        pass

    def test_excluded(self):
        self.fail("filtered out by -k")
'''

# imports only on stock: the file does not even collect on patched
EPSILON = '''\
import os
if os.environ.get("TFO_TEST_SIDE") == "patched":
    import tfo_no_such_module

def test_imports():
    pass
'''

# like test/export/test_torchbind.py without libtorchbind_test.so: every test fails alike on both sides
GAMMA = '''\
import unittest

class TorchbindLike(unittest.TestCase):
    def setUp(self):
        raise OSError("Could not find library 'libtfo_test.so'")

    def test_one(self):
        pass

    def test_two(self):
        pass

    def test_three(self):
        pass
'''

# segfaults on patched in its second test
CRASHY = '''\
import os
import signal

def test_a_before():
    pass

def test_b_crashes():
    if os.environ.get("TFO_TEST_SIDE") == "patched":
        os.kill(os.getpid(), signal.SIGSEGV)

def test_c_after():
    pass
'''

# a call that fails and then a teardown that errors: pytest counts 1 failed and 1 error for it (and its
# junit has two testcase entries), a passing call with an erroring teardown 1 passed and 1 error
TEARDOWN = '''\
import os
import pytest

@pytest.fixture
def resource():
    yield 1
    raise RuntimeError("teardown broke")

@pytest.fixture
def resource_patched():
    yield 1
    if os.environ.get("TFO_TEST_SIDE") == "patched":
        raise RuntimeError("teardown broke on patched")

def test_fails_then_teardown_errors(resource):
    assert resource == 2, "call broke"

def test_teardown_errors_patched(resource_patched):
    pass

def test_passes():
    pass
'''

SUITES = '''\
[suites.tiny]
description = "three small files"
files = ["test/test_alpha.py", "test/sub/test_beta.py", "test/test_epsilon.py"]
k = "not excluded"
timeout = 120
requires = ["pytest"]
deselect = [{ id = "test/test_alpha.py::test_known_broken", reason = "broken on stock too" }]

[suites.torchbind_like]
files = ["test/test_gamma.py"]
timeout = 60

[suites.torchbind_like_expected]
files = ["test/test_gamma.py"]
timeout = 60
expect_not_running = [{ file = "test/test_gamma.py", reason = "needs libtfo_test.so, which no wheel ships" }]

[suites.teardown]
files = ["test/test_teardown.py"]
timeout = 60

[suites.crashy]
files = ["test/test_crashy.py"]
timeout = 60

[suites.needs_missing_module]
files = ["test/test_alpha.py"]
timeout = 60
requires = ["pytest", "tfo_no_such_module"]

[suites.needs_torch]
files = ["test/test_alpha.py"]
timeout = 60
requires = ["torch"]

[suites.short_timeout]
files = ["test/test_alpha.py"]
k = "slow or always"
timeout = 2
requires = ["pytest"]
'''


def _wrapper(path: Path, extra: str = "") -> str:
    path.write_text(f'#!/bin/sh\n{extra}exec "{sys.executable}" "$@"\n')
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def env(tmp_path, monkeypatch):
    src = tmp_path / "pytorch"
    (src / "test" / "sub").mkdir(parents=True)
    (src / "test" / "test_alpha.py").write_text(ALPHA)
    (src / "test" / "sub" / "test_beta.py").write_text(BETA)
    for name, text in (("test_epsilon.py", EPSILON), ("test_gamma.py", GAMMA), ("test_crashy.py", CRASHY),
                       ("test_teardown.py", TEARDOWN)):
        (src / "test" / name).write_text(text)
    suites = tmp_path / "suites.toml"
    suites.write_text(SUITES)
    stock = _wrapper(tmp_path / "stock-python")
    patched = _wrapper(tmp_path / "patched-python", "TFO_TEST_SIDE=patched; export TFO_TEST_SIDE\n")
    monkeypatch.delenv("TFO_TEST_SIDE", raising=False)
    monkeypatch.delenv("TFO_TEST_SLOW", raising=False)
    return src, suites, stock, patched, tmp_path / "out"


def _listing(root: Path):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _run(env, *suites, **kw):
    src, suites_file, stock, patched, out = env
    lines = []
    reports = upstream_tests(pytorch_src=src, suites=list(suites), stock_python=kw.get("stock", stock),
                             patched_python=kw.get("patched", patched), out_dir=out, suites_file=suites_file,
                             echo=lines.append)
    return reports, "\n".join(lines)


def _ids(changes):
    return [c.id for c in changes]


def test_classifies_every_test(env):
    src, _, _, _, out = env
    before = _listing(src)
    (r,), text = _run(env, "tiny")
    alpha = "test/test_alpha.py::"
    assert _ids(r.regressions) == [alpha + "test_errors_patched", alpha + "test_regresses",
                                   "test/test_epsilon.py", "test/test_epsilon.py::test_imports"]
    assert _ids(r.suspected) == [alpha + "test_fails_differently"]
    assert _ids(r.fixes) == [alpha + "test_fixed"]
    # test_fails_alike: its address, id, numbers, temp path (and set order) differ per run, the failure not
    assert _ids(r.both_fail) == [alpha + "test_broken_everywhere", alpha + "test_fails_alike"]
    assert r.both_pass == 3  # test_always, test_slow, BetaTests.test_selected
    assert r.skipped == 1
    assert alpha + "test_known_broken" not in r.stock.outcomes  # deselected
    assert not any("excluded" in k for k in r.stock.outcomes)  # -k
    assert r.stock.complete and r.patched.complete
    assert r.stock.counts() == {"passed": 6, "failed": 4, "errored": 0, "skipped": 1, "crashed": 0}
    assert r.patched.counts() == {"passed": 4, "failed": 4, "errored": 2, "skipped": 1, "crashed": 0}
    assert exit_status([r]) == 1

    # every regression and suspected regression with its first error line, inline
    assert ("regressions (pass on stock, fail patched):\n"
            f"    {alpha}test_errors_patched\n"
            "        patched: errored: OSError: cannot open the device\n"
            f"    {alpha}test_regresses\n"
            "        patched: failed: AssertionError: broken by the patch\n"
            "    test/test_epsilon.py\n"
            "        stock:   not collected\n"
            "        patched: errored: ModuleNotFoundError: No module named 'tfo_no_such_module'\n"
            "    test/test_epsilon.py::test_imports\n"
            "        patched: not collected\n") in text
    assert (f"    {alpha}test_fails_differently\n"
            "        stock:   failed: AssertionError: graph: add(x, 1)\n"
            "        patched: failed: AssertionError: graph: opaque_region(x)\n") in text
    assert f"    {alpha}test_fixed\n        stock:   failed: AssertionError: fixed by the patch\n" in text
    assert f"    {alpha}test_broken_everywhere  failed: assert False\n" in text
    # per side and per file: passed / failed / errored / skipped / crashed
    assert "  patched: 4 passed, 4 failed, 2 errored, 1 skipped, 0 crashed; pytest exit 1 (complete)" in text
    assert ("    | file | passed | failed | errored | skipped | crashed |\n    |---|---|---|---|---|---|\n"
            "    | test/sub/test_beta.py | 1 / 1 | 0 / 0 | 0 / 0 | 0 / 0 | 0 / 0 |\n"
            "    | test/test_alpha.py | 4 / 3 | 4 / 4 | 0 / 1 | 1 / 1 | 0 / 0 |\n"
            "    | test/test_epsilon.py | 1 / 0 | 0 / 0 | 0 / 1 | 0 / 0 | 0 / 0 |\n") in text
    # the file that does not import on patched did not really run there
    assert ("    test/test_epsilon.py [patched]: no test passed: 1 of 1 failed with: "
            "ModuleNotFoundError: No module named 'tfo_no_such_module'") in text
    assert "deselected test/test_alpha.py::test_known_broken: broken on stock too" in text
    assert text.splitlines()[-2].endswith("NOT CLEAN (exit status 1)")

    data = json.loads((out / "report.json").read_text())
    assert data["exit_status"] == 1
    tiny = data["suites"]["tiny"]
    assert tiny["ok"] is False
    assert tiny["regressions"][1] == {"id": alpha + "test_regresses",
                                      "stock": {"status": "passed", "message": ""},
                                      "patched": {"status": "failed", "message": "AssertionError: broken by the patch"}}
    assert tiny["suspected_regressions"][0]["patched"]["message"] == "AssertionError: graph: opaque_region(x)"
    assert tiny["patched"]["errored"] == 2 and tiny["stock"]["passed"] == 6
    assert tiny["files"]["test/test_alpha.py"]["patched"]["errored"] == 1
    assert tiny["not_running"] == [{"file": "test/test_epsilon.py", "sides": ["patched"], "expected": None,
                                    "ran_on_both": 0, "passing_on_both": 0,
                                    "message": "no test passed: 1 of 1 failed with: "
                                    "ModuleNotFoundError: No module named 'tfo_no_such_module'"}]
    assert (out / "tiny-stock.xml").is_file() and (out / "tiny-patched.jsonl").is_file()
    assert _listing(src) == before  # no __pycache__, no .pytest_cache in the checkout


def test_same_interpreter_twice_is_clean(env, monkeypatch):
    src, suites, stock, _, out = env
    monkeypatch.setenv("TORCH_FORK_OVERLAY_STOCK_PYTHON", stock)
    monkeypatch.setenv("TORCH_FORK_OVERLAY_PATCHED_PYTHON", stock)
    reports = upstream_tests(pytorch_src=src, suites=["tiny"], out_dir=out, suites_file=suites, echo=lambda s: None)
    (r,) = reports
    assert r.regressions == r.suspected == r.fixes == r.not_running == []
    assert exit_status(reports) == 0


def test_a_file_that_did_not_really_run(env):
    # every test fails on both sides with one message: "0 regression(s)", and still not clean
    (r, expected), text = _run(env, "torchbind_like", "torchbind_like_expected")
    assert r.regressions == r.suspected == [] and len(r.both_fail) == 3
    assert [(n.file, n.sides, n.message, n.expected) for n in r.not_running] == [
        ("test/test_gamma.py", ("stock", "patched"),
         "no test passed: 3 of 3 failed with: OSError: Could not find library 'libtfo_test.so'", None)]
    assert exit_status([r]) == 1
    assert ("torchbind_like: 0 regression(s), 0 suspected regression(s), 0 fix(es), 3 failing on both, "
            "0 passing on both, 0 skipped, 1 file(s) that did not really run") in text
    assert ("  did not really run (the comparison says nothing about these):\n"
            "    test/test_gamma.py [stock and patched]: no test passed: 3 of 3 failed with: "
            "OSError: Could not find library 'libtfo_test.so'\n") in text
    assert "(+3 in the files above that did not really run; listed in report.json)" in text
    # the same file, marked expected (with its reason) in the suite: reported, and clean
    assert expected.not_running[0].expected == "needs libtfo_test.so, which no wheel ships"
    assert exit_status([expected]) == 0
    assert "        expected (suites file): needs libtfo_test.so, which no wheel ships" in text
    assert "did not really run: torchbind_like:test/test_gamma.py [stock and patched]; NOT CLEAN" in text


def _pytest_summary(log: Path) -> dict[str, int]:
    """The counts of pytest's own last line ("1 failed, 2 passed, 1 error in 0.05s"), in our words."""
    import re

    (line,) = re.findall(r"^(\d+ \w+(?:, \d+ \w+)*) in [\d.]+s", log.read_text(), re.M)
    words = {"passed": "passed", "failed": "failed", "error": "errored", "errors": "errored", "skipped": "skipped"}
    got = dict.fromkeys(("passed", "failed", "errored", "skipped", "crashed"), 0)
    for n, word in (part.split() for part in line.split(", ")):
        got[words[word]] += int(n)
    return got


def test_teardown_errors_are_counted_per_phase_as_pytest_does(env):
    import xml.etree.ElementTree as ET

    (r,), text = _run(env, "teardown")
    td = "test/test_teardown.py::"
    assert r.stock.counts() == {"passed": 2, "failed": 1, "errored": 1, "skipped": 0, "crashed": 0}
    assert r.patched.counts() == {"passed": 2, "failed": 1, "errored": 2, "skipped": 0, "crashed": 0}
    for run in (r.stock, r.patched):
        assert run.counts() == _pytest_summary(run.log)
        suite = ET.parse(run.junit).getroot().find("testsuite")
        assert (int(suite.get("failures")), int(suite.get("errors"))) == (run.counts()["failed"],
                                                                           run.counts()["errored"])
    # the teardown error is shown next to its test
    assert (f"    {td}test_fails_then_teardown_errors  failed: AssertionError: call broke; "
            "then errored in teardown: RuntimeError: teardown broke\n") in text
    assert (f"    {td}test_teardown_errors_patched\n"
            "        patched: errored: RuntimeError: teardown broke on patched\n") in text
    assert "  stock:   2 passed, 1 failed, 1 errored, 0 skipped, 0 crashed; pytest exit 1" in text
    assert "  patched: 2 passed, 1 failed, 2 errored, 0 skipped, 0 crashed; pytest exit 1" in text
    assert "    | test/test_teardown.py | 2 / 2 | 1 / 1 | 1 / 2 | 0 / 0 | 0 / 0 |" in text
    assert r.not_running == []


def test_a_crash_names_the_test_and_keeps_what_ran(env):
    (r,), text = _run(env, "crashy")
    crashy = "test/test_crashy.py::"
    assert r.stock.complete and not r.patched.complete
    assert r.patched.outcomes[crashy + "test_a_before"] == Outcome("passed")
    assert r.patched.outcomes[crashy + "test_b_crashes"] == Outcome(
        "crashed", "pytest died while it ran (killed by SIGSEGV)")
    assert _ids(r.regressions) == [crashy + "test_b_crashes"]
    assert r.not_run == {"stock": [], "patched": [crashy + "test_c_after"]}
    assert r.patched.counts()["crashed"] == 1
    assert exit_status([r]) == 1
    assert "        patched: crashed: pytest died while it ran (killed by SIGSEGV)" in text
    assert "  not run on patched (its run stopped early): 1 test(s), listed in report.json" in text
    assert "  patched run did not complete (killed by SIGSEGV): see " in text


def test_timeout_is_reported_incomplete(env, monkeypatch):
    monkeypatch.setenv("TFO_TEST_SLOW", "1")
    (r,), text = _run(env, "short_timeout")
    assert r.stock.timed_out and not r.stock.complete
    assert r.stock.outcomes["test/test_alpha.py::test_always"] == Outcome("passed")  # kept from before the kill
    assert r.stock.outcomes["test/test_alpha.py::test_slow"] == Outcome(
        "crashed", "pytest died while it ran (timed out after 2s)")
    assert exit_status([r]) == 1
    assert "  stock run did not complete (timed out after 2s): see " in text


def test_missing_interpreter(env):
    src, suites, stock, _, out = env
    with pytest.raises(OverlayError) as e:
        upstream_tests(pytorch_src=src, suites=["tiny"], stock_python=stock, patched_python="/nonexistent/python",
                       out_dir=out, suites_file=suites)
    assert "the patched interpreter /nonexistent/python does not exist" in e.value.what
    assert "TORCH_FORK_OVERLAY_PATCHED_PYTHON" in e.value.next
    assert not out.exists()


def test_missing_module(env):
    src, suites, stock, patched, out = env
    with pytest.raises(OverlayError) as e:
        upstream_tests(pytorch_src=src, suites=["needs_missing_module"], stock_python=stock,
                       patched_python=patched, out_dir=out, suites_file=suites)
    assert "cannot import tfo_no_such_module" in e.value.what
    assert "-m pip install tfo_no_such_module" in e.value.next


def test_torch_imported_from_the_checkout(env, tmp_path):
    src, suites, _, patched, out = env
    (src / "torch").mkdir()
    (src / "torch" / "__init__.py").write_text("__version__ = '2.15.0a0'\n")
    stock = _wrapper(tmp_path / "pp-python", f"PYTHONPATH={src}; export PYTHONPATH\n")
    with pytest.raises(OverlayError) as e:
        upstream_tests(pytorch_src=src, suites=["needs_torch"], stock_python=stock, patched_python=patched,
                       out_dir=out, suites_file=suites)
    assert "imports torch from the checkout" in e.value.what


def test_missing_test_file_and_unknown_suite(env):
    src, suites, stock, patched, out = env
    (src / "test" / "sub" / "test_beta.py").unlink()
    with pytest.raises(OverlayError) as e:
        upstream_tests(pytorch_src=src, suites=["tiny"], stock_python=stock, patched_python=patched,
                       out_dir=out, suites_file=suites)
    assert "lacks test file(s) test/sub/test_beta.py" in e.value.what
    with pytest.raises(OverlayError) as e:
        upstream_tests(pytorch_src=src, suites=["nope"], suites_file=suites)
    assert "no suite named nope" in e.value.what and "tiny" in e.value.cause


def test_not_a_checkout(tmp_path):
    with pytest.raises(OverlayError) as e:
        upstream_tests(pytorch_src=tmp_path)
    assert "has no test/ folder" in e.value.what


@pytest.mark.parametrize("toml, error", [
    ('deselect=[{id="a::b"}]', "suite x: deselect 'a::b' has no reason"),
    ('expect_not_running=[{file="a"}]', "suite x: expect_not_running 'a' has no reason"),
    ('expect_not_running=[{file="b", reason="r"}]', "expect_not_running names b, not in its files"),
    ('expect_not_runing=[{file="a", reason="r"}]', "unknown field(s) expect_not_runing"),
])
def test_suites_file_is_checked(tmp_path, toml, error):
    bad = tmp_path / "s.toml"
    bad.write_text(f'[suites.x]\nfiles=["a"]\ntimeout=1\n{toml}\n')
    with pytest.raises(OverlayError) as e:
        load_suites(bad)
    assert error in e.value.what
    assert "docs/upstream.md" in e.value.next


def test_shipped_suites_name_the_upstream_files():
    suites = load_suites()
    assert set(suites) >= {"fake_tensor", "dynamo", "export", "proxy"}
    assert suites["fake_tensor"].files == ("test/test_fake_tensor.py",)
    assert "test/dynamo/test_wrap_inductor_compiled_regions.py" in suites["dynamo"].files
    assert suites["export"].files == ("test/export/test_export.py",)
    assert suites["proxy"].files == ("test/test_proxy_tensor.py",)
    for s in suites.values():
        assert {"torch", "numpy", "pytest", "expecttest", "hypothesis"} <= set(s.requires)


def test_cli_exit_status_and_report(env):
    import subprocess

    src, suites, stock, patched, out = env
    repo = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "torch_fork_overlay", "upstream-tests", "--pytorch-src", str(src),
           "--suite", "tiny", "--suites-file", str(suites), "--out-dir", str(out),
           "--stock-python", stock, "--patched-python", patched]
    cp = subprocess.run(cmd, capture_output=True, text=True, cwd=repo)
    assert cp.returncode == 1, cp.stderr
    assert "regressions (pass on stock, fail patched):\n    test/test_alpha.py::test_errors_patched" in cp.stdout
    cp = subprocess.run(cmd[:-1] + [stock], capture_output=True, text=True, cwd=repo)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cp = subprocess.run(cmd[:-1] + ["/nonexistent/python"], capture_output=True, text=True, cwd=repo)
    assert cp.returncode == 2 and cp.stderr.startswith("error: the patched interpreter")
    assert "Traceback" not in cp.stderr
    cp = subprocess.run(cmd[:4] + ["--list", "--suites-file", str(suites)], capture_output=True, text=True, cwd=repo)
    assert cp.returncode == 0, cp.stderr
    assert "  deselect test/test_alpha.py::test_known_broken: broken on stock too\n" in cp.stdout
    assert "  expected not to run test/test_gamma.py: needs libtfo_test.so, which no wheel ships\n" in cp.stdout


# --- compare on hand-made outcomes ------------------------------------------------

SUITE = Suite(name="s", description="", files=("test/test_x.py",), timeout=1)


def _fake_run(side, outcomes, complete=True, prefixes=()):
    outs = {k: o if isinstance(o, Outcome) else Outcome(*o) for k, o in outcomes.items()}
    return Run(side, "python", 0 if complete else -11, False, 0.0, Path("log"), outs, finished=complete,
               prefixes=prefixes)


F = ("failed", "AssertionError: x")


@pytest.mark.parametrize(
    "stock_outcome, patched_outcome, where",
    [
        (("passed",), ("skipped", "Skipped: no"), "regressions"),  # a pass that turned into a skip
        (("skipped", "Skipped: no"), F, "regressions"),            # newly failing
        (("passed",), ("crashed", "pytest died"), "regressions"),
        (("passed",), ("errored", "OSError: setup"), "regressions"),
        (("passed",), None, "regressions"),                         # not collected on patched
        (None, ("errored", "ImportError: x"), "regressions"),       # a collection error only on patched
        (F, None, "suspected"),                                     # failing on stock, not collected on patched
        (F, ("skipped", "Skipped: no"), "suspected"),               # failing on stock, skipped on patched
        (F, ("errored", "AssertionError: x"), "suspected"),         # the same line, another status
        (F, ("failed", "AssertionError: y"), "suspected"),          # another first line
        (F, ("crashed", "pytest died"), "suspected"),
        (F, Outcome("failed", "AssertionError: x", teardown="RuntimeError: y"), "suspected"),  # a new teardown error
        (("failed", "AssertionError: 3 != 4 at 0x7f01"), ("failed", "AssertionError: 3 != 5 at 0x7e02"),
         "both_fail"),                                              # numbers and addresses normalized
        (F, F, "both_fail"),
        (F, ("passed",), "fixes"),
        (("errored", "OSError: x"), ("passed",), "fixes"),
        (None, ("passed",), "only_patched"),
    ],
)
def test_compare_reports_every_status_change(stock_outcome, patched_outcome, where):
    key = "test/test_x.py::test_y"
    other = {"test/test_x.py::test_ok": ("passed",)} | {f"test/test_x.py::test_ok{i}": ("passed",) for i in range(3)}
    report = compare(SUITE, _fake_run("stock", other | ({key: stock_outcome} if stock_outcome else {})),
                     _fake_run("patched", other | ({key: patched_outcome} if patched_outcome else {})))
    found = {name: [c.id for c in getattr(report, name) if c.id == key]
             for name in ("regressions", "suspected", "fixes", "both_fail", "only_patched")}
    assert [name for name, keys in found.items() if keys] == [where]
    assert report.not_running == []
    assert exit_status([report]) == (where in ("regressions", "suspected"))


def test_missing_from_an_incomplete_run_is_not_run():
    report = compare(SUITE, _fake_run("stock", {"test/test_x.py::a": ("passed",), "test/test_x.py::b": F}),
                     _fake_run("patched", {"test/test_x.py::a": ("passed",)}, complete=False))
    assert report.not_run == {"stock": [], "patched": ["test/test_x.py::b"]}
    assert report.regressions == report.suspected == []
    assert exit_status([report]) == 1  # the incomplete run


@pytest.mark.parametrize("outcomes, message", [
    # zero passes: did not really run, whatever the failures
    ({"a": ("failed", "OSError: lib 1"), "b": ("failed", "OSError: lib 2")},
     "no test passed: 2 of 2 failed with: OSError: lib 1"),
    ({"a": F, "b": ("errored", "OSError: x"), "c": ("skipped", "Skipped: cuda")},
     "no test passed: 2 failed, the most common failure (1 of them): AssertionError: x"),
    ({"a": ("crashed", "pytest died while it ran (killed by SIGSEGV)")},
     "no test passed: 1 of 1 failed with: pytest died while it ran (killed by SIGSEGV)"),
    ({"a": ("skipped", "Skipped: cuda"), "b": ("skipped", "Skipped: cuda")},
     "every test skipped (2): Skipped: cuda"),
    ({}, "no test ran: none collected, or all deselected"),
    # some passes: more than half of the tests that ran fail alike (at least 2)
    ({"a": ("passed",), "b": F, "c": F}, "2 of 3 tests that ran failed with one message: AssertionError: x"),
    ({"a": ("passed",), "b": F, "c": F, "s": ("skipped", "Skipped: cuda")},
     "2 of 3 tests that ran failed with one message: AssertionError: x"),
    ({"a": ("passed",), "b": ("passed",), "c": F, "d": F}, None),  # half is not more than half
    ({"a": ("passed",), "b": F, "c": ("failed", "AssertionError: y")}, None),  # two different failures
    ({"a": ("passed",), "b": F}, None),  # one failure is not a pattern
    ({"a": ("passed",), "b": F, "c": ("errored", "AssertionError: x")}, None),  # a failure and an error differ
])
def test_did_not_really_run_rule(outcomes, message):
    outcomes = {f"test/test_x.py::{k}": v for k, v in outcomes.items()}
    report = compare(SUITE, _fake_run("stock", outcomes), _fake_run("patched", outcomes))
    assert [n.message for n in report.not_running] == ([message] if message else [])
    if message:
        assert report.not_running[0].sides == ("stock", "patched")
        assert f"test/test_x.py [stock and patched]: {message}" in format_report(report)
    assert exit_status([report]) == (1 if message else 0)


def test_did_not_really_run_on_one_side():
    ok = {"test/test_x.py::a": ("passed",), "test/test_x.py::b": ("passed",)}
    broken = {k: ("failed", "ImportError: cannot import name 'x'") for k in ok}
    report = compare(SUITE, _fake_run("stock", ok), _fake_run("patched", broken))
    assert [(n.sides, n.message) for n in report.not_running] == [
        (("patched",), "no test passed: 2 of 2 failed with: ImportError: cannot import name 'x'")]


def test_expected_not_running_that_runs_is_noted():
    suite = Suite(name="s", description="", files=("test/test_x.py",), timeout=1,
                  expect_not_running=(("test/test_x.py", "needs a library"),))
    ok = _fake_run("stock", {"test/test_x.py::a": ("passed",)})
    report = compare(suite, ok, ok)
    assert report.expected_but_ran == [("test/test_x.py", "needs a library")]
    assert "is listed in expect_not_running (needs a library) but ran on both sides" in format_report(report)
    assert exit_status([report]) == 0


def test_normalize():
    assert normalize("RuntimeError: <object object at 0x7f3a2c> id 140023 took 12.5 ms") == \
        "RuntimeError: <object object at <hex>> id N took N.N ms"
    assert normalize("OSError: /tmp/tmpab12cd/x.bin and '/var/tmp/q'") == "OSError: <tmp> and '<tmp>'"
    assert normalize("OSError: /scratch/t/tmpq1/x.so", tmpdirs=("/scratch/t",)) == "OSError: <tmp>"
    assert normalize("OSError: /tmpfoo/x /home/u/tmp/x") == "OSError: /tmpfoo/x /home/u/tmp/x"
    # each side's own environment: the same failure in .venv-stock and .venv
    assert normalize("RuntimeError: no lib in /w/.venv-stock/lib/torch", ("/w/.venv-stock",)) == \
        normalize("RuntimeError: no lib in /w/.venv/lib/torch", ("/w/.venv",))
    assert normalize("AssertionError: add(x, 1)") != normalize("AssertionError: opaque_region(x)")


def _sources_like(prefix: str) -> dict:
    """Like test/dynamo/test_sources.py on 2.15.0: 5 of 9 tests that ran need a newer API (the
    message names the interpreter's own torch), 3 really run and pass, 1 fails on its own."""
    imp = f"ImportError: cannot import name 'newer_api' from 'torch._dynamo' ({prefix}/lib/torch/_dynamo/__init__.py)"
    return ({f"test/test_x.py::new{i}": ("failed", imp) for i in range(5)}
            | {f"test/test_x.py::ok{i}": ("passed",) for i in range(3)}
            | {"test/test_x.py::other": F, "test/test_x.py::gpu": ("skipped", "Skipped: no GPU")})


def test_did_not_really_run_alike_but_for_the_interpreter_path_is_said_once():
    report = compare(SUITE, _fake_run("stock", _sources_like("/w/.venv-stock"), prefixes=("/w/.venv-stock",)),
                     _fake_run("patched", _sources_like("/w/.venv"), prefixes=("/w/.venv",)))
    assert [(n.file, n.sides) for n in report.not_running] == [("test/test_x.py", ("stock", "patched"))]
    text = format_reports([report])
    assert ("    test/test_x.py [stock and patched]: 5 of 9 tests that ran failed with one message: "
            "ImportError: cannot import name 'newer_api' from 'torch._dynamo' "
            "(/w/.venv-stock/lib/torch/_dynamo/__init__.py)\n") in text
    assert "did not really run: s:test/test_x.py [stock and patched]; NOT CLEAN" in text


def test_did_not_really_run_differently_on_each_side_labels_the_sides():
    stock, patched = _sources_like("/w/.venv-stock"), _sources_like("/w/.venv")
    patched["test/test_x.py::ok0"] = patched["test/test_x.py::new0"]  # 6 of 9 on patched
    report = compare(SUITE, _fake_run("stock", stock, prefixes=("/w/.venv-stock",)),
                     _fake_run("patched", patched, prefixes=("/w/.venv",)))
    assert [n.sides for n in report.not_running] == [("stock",), ("patched",)]
    assert "did not really run: s:test/test_x.py [stock], s:test/test_x.py [patched]; NOT CLEAN" in \
        format_reports([report])


def test_did_not_really_run_says_how_many_tests_ran_on_both_sides():
    """The verdict stays; the tests that ran on both sides without that failure are counted next to it."""
    report = compare(SUITE, _fake_run("stock", _sources_like("/w/.venv-stock"), prefixes=("/w/.venv-stock",)),
                     _fake_run("patched", _sources_like("/w/.venv"), prefixes=("/w/.venv",)))
    (n,) = report.not_running
    assert (len(n.compared), n.passing_on_both) == (4, 3)  # ok0-2 pass on both; other fails alike on both
    assert ("(/w/.venv-stock/lib/torch/_dynamo/__init__.py)\n"
            "        4 of its tests ran on both sides without that failure (3 passing on both); "
            "they are compared one by one\n") in format_report(report)
    # so the one among them that fails on both sides is listed; the 5 alike are not again
    assert ("  failing on both, the same failure (not caused by the patch):\n"
            "    test/test_x.py::other  failed: AssertionError: x\n"
            "    (+5 in the files above that did not really run; listed in report.json)") in format_report(report)
    assert exit_status([report]) == 1
    assert report_json(report)["not_running"][0] | {"message": ""} == {
        "file": "test/test_x.py", "sides": ["stock", "patched"], "message": "", "expected": None,
        "ran_on_both": 4, "passing_on_both": 3}
