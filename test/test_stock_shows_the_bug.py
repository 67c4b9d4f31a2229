"""The counterfactual: stock torch fails where the patch fixes it, for the
reason the patch exists in that release; the patched torch passes.

What stock torch does is data, per range of releases: test/stock_failures.toml.

* The seed case, ``x * 2 + 1`` compiled under a FakeTensorMode with eager /
  aot_eager / inductor, on the stock interpreter (TORCH_FORK_OVERLAY_STOCK_PYTHON):
  each backend fails as its release's ``[[seed]]`` range says, or passes where
  it says so (a sanity check); on the patched one (TORCH_FORK_OVERLAY_PATCHED_PYTHON)
  every backend returns a FakeTensor of the mode.
* The contract tests (CONTRACT: one class per patch of the fix, in
  test/dynamo/test_compile_under_fake_mode*.py) on stock, for releases with a
  ``[[contract]]`` range: the listed ones, named by method wherever they live,
  fail with their message, read from a junit XML.

tools/test sets both variables (the default release); tools/test-releases sets
one at a time for every other release. A test whose interpreter is not set skips.
Each side runs in one subprocess, so this file never imports torch itself.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "test" / "stock_failures.toml"
# The contract tests: (file, class), one per patch of the fix. [[contract]]
# entries name a test by its method name, which is unique across these classes.
# Not CompileUnderFakeModeRegionTests, which runs them all again with regions.
CONTRACT = [
    ("test/dynamo/test_compile_under_fake_mode.py", "CompileUnderFakeModeTests"),
    ("test/dynamo/test_compile_under_fake_mode_guards.py", "CompileUnderFakeModeGuardTests"),
    ("test/dynamo/test_compile_under_fake_mode_backends.py", "CompileUnderFakeModeBackendTests"),
    ("test/dynamo/test_compile_under_fake_mode_trackers.py", "CompileUnderFakeModeTrackerTests"),
    ("test/dynamo/test_compile_under_fake_mode_optimizer.py", "CompileUnderFakeModeOptimizerTests"),
    ("test/dynamo/test_compile_under_fake_mode_regions.py", "CompileUnderFakeModeRegionTieringTests"),
]
BACKENDS = ["eager", "aot_eager", "inductor"]

SEED = r"""
import json, sys
import torch
import torch._functorch.config
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

print("VERSION", torch.__version__, flush=True)
# Reading a FakeTensor's data pointer raises instead of crashing.
torch._functorch.config.fake_tensor_allow_unsafe_data_ptr_access = False
for backend in sys.argv[1:]:
    print("CASE", backend, flush=True)
    torch._dynamo.reset()
    try:
        fn = torch.compile(lambda x: x * 2 + 1, backend=backend)
        with FakeTensorMode() as mode:
            x = torch.randn(4, 3)
            out = fn(x)
            ref = x * 2 + 1
        meta = lambda t: (tuple(t.shape), t.stride(), t.dtype, t.device)
        if not isinstance(out, FakeTensor):
            result = f"wrong: returned a {type(out).__name__}, not a FakeTensor"
        elif out.fake_mode is not mode:
            result = "wrong: a FakeTensor of another mode"
        elif meta(out) != meta(ref):
            result = f"wrong: metadata {meta(out)} instead of eager's {meta(ref)}"
        else:
            result = "ok"
    except Exception as e:
        result = f"{type(e).__name__}: {e}"
    print("RESULT " + json.dumps([backend, result]), flush=True)
"""


# -- the data -----------------------------------------------------------------------

def load_data(path: Path = DATA) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def release_of(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0`` (also ``2.15.0+cu132.fakemode.1``, ``2.16.0a0``)."""
    return Version(version).base_version


def entries_for(release: str, kind: str, data: dict | None = None) -> list[dict]:
    data = load_data() if data is None else data
    return [e for e in data.get(kind, []) if SpecifierSet(e["releases"]).contains(release_of(release))]


def seed_expectation(release: str, data: dict | None = None) -> dict:
    """The one ``[[seed]]`` entry whose range holds ``release``."""
    found = entries_for(release, "seed", data)
    if len(found) != 1:
        pytest.fail(
            f"{DATA.name}: torch {release} falls in {len(found)} [[seed]] ranges "
            f"({', '.join(e['releases'] for e in found) or 'none'}); it must fall in exactly one: "
            "say what the seed case does on this release's stock torch there"
        )
    return found[0]


def short(result: str, limit: int = 600) -> str:
    """An exception message without the C++ frames torch appends to it."""
    result = result.split("\nException raised from ", 1)[0]
    return result if len(result) <= limit else result[:limit] + " ..."


def stock_problems(expected: dict, results: dict[str, str]) -> list[str]:
    """What differs between the stock results and a ``[[seed]]`` entry."""
    problems = []
    for backend in expected.get("passes", []):
        got = results.get(backend, "did not run")
        if got != "ok":
            problems.append(f"{backend} should pass on stock (sanity check), but: {short(got)}")
    for backend, pattern in expected.get("fails", {}).items():
        got = results.get(backend, "did not run")
        if got == "ok":
            problems.append(f"{backend} passed on stock: the seed case does not show the bug here "
                            f"(expected {pattern!r}; {expected['releases']}: {' '.join(expected['why'].split())})")
        elif not re.search(pattern, got):
            problems.append(f"{backend} failed on stock, but not as {expected['releases']} says "
                            f"({pattern!r}): {short(got)}")
    return problems


# -- running a side -------------------------------------------------------------------

def interpreter(side: str) -> str:
    var = f"TORCH_FORK_OVERLAY_{side.upper()}_PYTHON"
    py = os.environ.get(var)
    if not py:
        pytest.skip(f"{var} is not set (tools/test and tools/test-releases set it)")
    return py


def run_seed(python: str, backends=BACKENDS) -> tuple[str, dict[str, str]]:
    """(torch.__version__, {backend: "ok" | "wrong: ..." | "Type: message"})."""
    proc = subprocess.run([python, "-c", SEED, *backends], cwd=REPO, capture_output=True, text=True,
                          timeout=900)
    version, results, case = "?", {}, None
    for line in proc.stdout.splitlines():
        if line.startswith("VERSION "):
            version = line.split(None, 1)[1]
        elif line.startswith("CASE "):
            case = line.split(None, 1)[1]
        elif line.startswith("RESULT "):
            backend, result = json.loads(line[len("RESULT "):])
            results[backend] = result
    if proc.returncode != 0:
        how = (f"killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
               else f"exit status {proc.returncode}")
        pytest.fail(f"the seed case ({python}) stopped ({how}) during backend {case}:\n"
                    f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return version, results


def test_seed_case_on_stock_fails_for_the_release_reason():
    version, results = run_seed(interpreter("stock"))
    expected = seed_expectation(version)
    problems = stock_problems(expected, results)
    assert not problems, f"stock torch {version}:\n" + "\n\n".join(problems)


def test_seed_case_on_patched_passes():
    version, results = run_seed(interpreter("patched"))
    wrong = {b: short(r) for b, r in results.items() if r != "ok"}
    assert results and not wrong, f"patched torch {version}: " + json.dumps(wrong or results, indent=1)


# -- the contract tests on stock ---------------------------------------------------------

def torch_version_of(python: str) -> str:
    """torch's version as its distribution metadata says, without importing torch."""
    return subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def contract_ids(python: str, names: list[str], env: dict[str, str]) -> list[str]:
    """The pytest ids of the contract tests with these method names, in whichever
    file and class of CONTRACT each one lives (collected by the stock interpreter:
    parametrized tests get their names there)."""
    proc = subprocess.run(
        [python, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "stock_config_shim",
         *(f"{file}::{cls}" for file, cls in CONTRACT)],
        cwd=REPO, capture_output=True, text=True, timeout=900, env=env,
    )
    if proc.returncode != 0:
        pytest.fail(f"stock pytest could not collect the contract tests:\n{proc.stdout[-3000:]}\n"
                    f"{proc.stderr[-3000:]}")
    ids = [line for line in proc.stdout.splitlines() if "::" in line and line.rsplit("::", 1)[1] in names]
    found = [i.rsplit("::", 1)[1] for i in ids]
    twice = sorted({n for n in found if found.count(n) > 1})
    assert not twice, f"contract tests named alike in two classes of CONTRACT: {twice}"
    return ids


def run_on_stock(tmp_path, python: str, names: list[str]) -> dict[str, str | None]:
    report = tmp_path / "junit.xml"
    # stock_config_shim: stock torch lacks the patch's config switches, which the
    # tests set; without them every test would fail in setUp for that alone.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "test"),
                                                                    os.environ.get("PYTHONPATH")])))
    # A name no class holds is left out here, and reported as not run.
    ids = contract_ids(python, names, env)
    if not ids:
        return {}
    proc = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "stock_config_shim",
         f"--junitxml={report}", *ids],
        cwd=REPO, capture_output=True, text=True, timeout=900, env=env,
    )
    assert report.exists(), f"stock pytest wrote no report:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        results[case.get("name")] = (
            None if failure is None else failure.get("message", "") + (failure.text or "")
        )
    return results


# One test, so that the stock run (a minute of Inductor compiles) happens once
# whatever pytest-xdist does with the tests of this file.
def test_stock_torch_fails_where_the_patch_fixes(tmp_path):
    python = interpreter("stock")
    version = torch_version_of(python)
    found = entries_for(version, "contract")
    if not found:
        pytest.skip(f"{DATA.name} records no stock failures of the contract tests for torch {version} "
                    "(the seed case covers this release)")
    assert len(found) == 1, f"torch {version} falls in {len(found)} [[contract]] ranges of {DATA.name}"
    fails, passes = found[0].get("fails", {}), found[0].get("passes", [])
    results = run_on_stock(tmp_path, python, [*fails, *passes])
    problems = []
    for name in passes:
        if results.get(name, "did not run") is not None:
            problems.append(f"{name} should pass on stock: {results.get(name, 'did not run')[-500:]}")
    for name, reason in fails.items():
        failure = results.get(name)
        if name not in results:
            problems.append(f"{name} did not run on stock")
        elif failure is None:
            problems.append(f"{name} passed on stock: the test does not show the bug")
        elif reason not in failure:
            problems.append(f"{name} failed on stock, but not with {reason!r}: {failure[-800:]}")
    assert not problems, f"stock torch {version}:\n" + "\n\n".join(problems)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
