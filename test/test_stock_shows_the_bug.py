"""The counterfactual: the upstream-style tests that pass on the patched torch
fail on stock torch, each for the reason the patch exists.

Runs test/dynamo/test_compile_under_fake_mode.py with the stock interpreter
(TORCH_FORK_OVERLAY_STOCK_PYTHON, set by tools/test) in one subprocess and reads
its junit XML. A sanity case must pass on stock, so a broken stock environment
cannot make every case "fail" for the wrong reason.
"""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEST_FILE = REPO / "test" / "dynamo" / "test_compile_under_fake_mode.py"
CLASS = "CompileUnderFakeModeTests"

# test name -> what stock torch does instead (the message pytest reports)
FAILS_ON_STOCK = {
    # Inductor's kernels run on FakeTensors and read their data pointers.
    "test_outputs_owned_by_mode_backend_inductor": "Cannot access data pointer",
    "test_training_backward_backend_inductor": "non-Fake Tensor",
    # A fake cuda tensor makes Inductor look for a GPU.
    "test_fake_cuda_input_backend_inductor": "Found no NVIDIA driver",
    # The real artifact is reused under the fake mode: a real tensor comes back.
    "test_no_tensor_inputs_real_then_fake_backend_inductor": "is not an instance of",
    # aot_eager's mutation epilogue bumps version counters unlike eager.
    "test_inplace_mutation_of_inputs_backend_aot_eager": "AssertionError",
}
PASSES_ON_STOCK = ["test_outputs_owned_by_mode_backend_eager"]


def run_on_stock(tmp_path):
    stock_python = os.environ.get("TORCH_FORK_OVERLAY_STOCK_PYTHON")
    if not stock_python:
        pytest.skip("TORCH_FORK_OVERLAY_STOCK_PYTHON is not set (tools/test sets it)")
    report = tmp_path / "junit.xml"
    ids = [f"{TEST_FILE}::{CLASS}::{name}" for name in [*FAILS_ON_STOCK, *PASSES_ON_STOCK]]
    proc = subprocess.run(
        [stock_python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"--junitxml={report}", *ids],
        cwd=REPO, capture_output=True, text=True, timeout=900,
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
    results = run_on_stock(tmp_path)
    problems = []
    for name in PASSES_ON_STOCK:
        if results.get(name, "did not run") is not None:
            problems.append(f"{name} should pass on stock: {results.get(name, 'did not run')[-500:]}")
    for name, reason in FAILS_ON_STOCK.items():
        failure = results.get(name)
        if name not in results:
            problems.append(f"{name} did not run on stock")
        elif failure is None:
            problems.append(f"{name} passed on stock: the test does not show the bug")
        elif reason not in failure:
            problems.append(f"{name} failed on stock, but not with {reason!r}: {failure[-800:]}")
    assert not problems, "\n\n".join(problems)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
