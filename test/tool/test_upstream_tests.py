"""``upstream-tests`` end to end on a tiny checkout, with real pytest runs.

Both "interpreters" are the Python running these tests, behind two wrapper
scripts; the patched one sets TFO_TEST_SIDE=patched, which makes one test fail
and another pass only there -- so regression / fix classification is proven on
real junit-xml, not on mocks.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from torch_fork_overlay.errors import OverlayError
from torch_fork_overlay.upstream_tests import (
    exit_status,
    load_suites,
    upstream_tests,
)

ALPHA = '''\
import os
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
'''

BETA = '''\
import unittest

class BetaTests(unittest.TestCase):
    def test_selected(self):
        pass

    def test_excluded(self):
        self.fail("filtered out by -k")
'''

SUITES = '''\
[suites.tiny]
description = "two small files"
files = ["test/test_alpha.py", "test/sub/test_beta.py"]
k = "not excluded"
timeout = 120
requires = ["pytest"]
deselect = [{ id = "test/test_alpha.py::test_known_broken", reason = "broken on stock too" }]

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
k = "slow"
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
    suites = tmp_path / "suites.toml"
    suites.write_text(SUITES)
    stock = _wrapper(tmp_path / "stock-python")
    patched = _wrapper(tmp_path / "patched-python", "TFO_TEST_SIDE=patched; export TFO_TEST_SIDE\n")
    monkeypatch.delenv("TFO_TEST_SIDE", raising=False)
    monkeypatch.delenv("TFO_TEST_SLOW", raising=False)
    return src, suites, stock, patched, tmp_path / "out"


def _listing(root: Path):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_classifies_regressions_and_fixes(env):
    src, suites, stock, patched, out = env
    before = _listing(src)
    lines = []
    reports = upstream_tests(pytorch_src=src, suites=["tiny"], stock_python=stock, patched_python=patched,
                             out_dir=out, suites_file=suites, echo=lines.append)
    (r,) = reports
    assert r.regressions == ["test/test_alpha.py::test_regresses"]
    assert r.fixes == ["test/test_alpha.py::test_fixed"]
    assert r.both_fail == ["test/test_alpha.py::test_broken_everywhere"]
    assert r.both_pass == 3  # test_always, test_slow, BetaTests.test_selected
    assert r.skipped == 1
    assert "test/test_alpha.py::test_known_broken" not in r.stock.outcomes  # deselected
    assert not any("excluded" in k for k in r.stock.outcomes)  # -k
    assert r.stock.complete and r.patched.complete
    assert exit_status(reports) == 1
    text = "\n".join(lines)
    assert "tiny: 1 regression(s), 1 fix(es), 1 failing on both" in text
    assert "deselected test/test_alpha.py::test_known_broken: broken on stock too" in text
    data = json.loads((out / "report.json").read_text())
    assert data["suites"]["tiny"]["regressions"] == ["test/test_alpha.py::test_regresses"]
    assert (out / "tiny-stock.xml").is_file() and (out / "tiny-patched.xml").is_file()
    assert _listing(src) == before  # no __pycache__, no .pytest_cache in the checkout


def test_same_interpreter_twice_is_clean(env, monkeypatch):
    src, suites, stock, _, out = env
    monkeypatch.setenv("TORCH_FORK_OVERLAY_STOCK_PYTHON", stock)
    monkeypatch.setenv("TORCH_FORK_OVERLAY_PATCHED_PYTHON", stock)
    reports = upstream_tests(pytorch_src=src, suites=["tiny"], out_dir=out, suites_file=suites, echo=lambda s: None)
    assert reports[0].regressions == [] and reports[0].fixes == []
    assert exit_status(reports) == 0


def test_timeout_is_reported_incomplete(env, monkeypatch):
    src, suites, stock, patched, out = env
    monkeypatch.setenv("TFO_TEST_SLOW", "1")
    reports = upstream_tests(pytorch_src=src, suites=["short_timeout"], stock_python=stock,
                             patched_python=patched, out_dir=out, suites_file=suites, echo=lambda s: None)
    assert reports[0].stock.timed_out and not reports[0].stock.complete
    assert exit_status(reports) == 1


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


def test_deselect_needs_a_reason(tmp_path):
    bad = tmp_path / "s.toml"
    bad.write_text('[suites.x]\nfiles=["a"]\ntimeout=1\ndeselect=[{id="a::b"}]\n')
    with pytest.raises(OverlayError) as e:
        load_suites(bad)
    assert "has no reason" in e.value.what


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
    assert "regressions (pass on stock, fail patched):\n    test/test_alpha.py::test_regresses" in cp.stdout
    cp = subprocess.run(cmd[:-1] + [stock], capture_output=True, text=True, cwd=repo)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cp = subprocess.run(cmd[:-1] + ["/nonexistent/python"], capture_output=True, text=True, cwd=repo)
    assert cp.returncode == 2 and cp.stderr.startswith("error: the patched interpreter")
    assert "Traceback" not in cp.stderr


@pytest.mark.parametrize(
    "stock_outcome, patched_outcome, where",
    [
        ("passed", "skipped", "regressions"),   # a pass that turned into a skip can hide a failure
        ("skipped", "failed", "regressions"),   # newly failing
        ("passed", None, "regressions"),        # crashed or not collected on patched
        ("failed", None, "both_fail"),          # still not passing, now crashing
        ("failed", "passed", "fixes"),
        (None, "passed", "only_patched"),
    ],
)
def test_compare_reports_every_status_change(tmp_path, stock_outcome, patched_outcome, where):
    from torch_fork_overlay.upstream_tests import Run, Suite, compare

    def run(side, outcome):
        outcomes = {} if outcome is None else {"test/test_x.py::test_y": outcome}
        return Run(side, "python", 0, False, 0.0, tmp_path / "j.xml", tmp_path / "log", outcomes)

    suite = Suite.__new__(Suite)
    report = compare(suite, run("stock", stock_outcome), run("patched", patched_outcome))
    found = {name: [k for k in getattr(report, name) if k.startswith("test/test_x.py::test_y")]
             for name in ("regressions", "fixes", "both_fail", "only_patched")}
    assert [name for name, keys in found.items() if keys] == [where]
