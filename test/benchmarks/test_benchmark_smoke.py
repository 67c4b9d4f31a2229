"""Smoke test of the benchmark harness: one tiny worker run per scenario, minimal sizes, checked for sane JSON.

This guards benchmarks/ against bit-rot; it measures nothing. It runs the worker on the interpreter running pytest
(skipped where that interpreter has no torch) with the eager / aot_eager backends so it takes seconds, not an
inductor compile.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO, "benchmarks", "worker.py")
RUNNER = os.path.join(REPO, "benchmarks", "run.py")

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


def run_worker(*args: str) -> dict:
    proc = subprocess.run([sys.executable, WORKER, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_JSON ")]
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0][len("BENCH_JSON "):])


def check_common(result: dict) -> None:
    assert result["status"] == "ok", result
    assert result["torch_version"].startswith("2.")
    assert isinstance(result["patch_present"], bool)
    assert 100 < result["peak_rss_mb"] < 64 * 1024
    assert result["peak_rss_mb"] >= result["rss_after_import_mb"]


@needs_torch
@pytest.mark.parametrize("mode,extra", [("eager", []), ("compile", ["--backend", "aot_eager", "--backward"])])
def test_fake_tiny(mode, extra):
    result = run_worker("fake", "--preset", "tiny", "--mode", mode, "--seq", "16", "--repeats", "1", *extra)
    check_common(result)
    assert result["out_type"] == "FakeTensor"
    assert result["out_shape"] == [1, 16, 32000]
    assert 0 < result["first_s"] < 120
    assert result["steady_s"]["n"] == 1
    assert 0 < result["steady_s"]["min"] <= result["steady_s"]["median"] <= result["steady_s"]["max"]
    if mode == "compile":
        assert result["graphs"] >= 1


@needs_torch
def test_cache_hit():
    result = run_worker("cache-hit", "--variant", "eight", "--backend", "eager", "--calls", "10", "--warmup", "2",
                        "--repeats", "2")
    check_common(result)
    assert 0 < result["per_call_s"]["median"] < 1
    assert result["graphs"] == 1


@needs_torch
def test_callgrind_worker_outside_valgrind():
    # The valgrind hooks are no-ops outside valgrind; this checks the worker's plumbing, not the counts.
    result = run_worker("callgrind", "--calls", "3", "--warmup", "1")
    check_common(result)
    assert result["variants"] == ["one", "eight", "linear"]
    assert result["graphs"] == 3


def test_runner_help():
    proc = subprocess.run([sys.executable, RUNNER, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--patched-python" in proc.stdout and "--quick" in proc.stdout


def test_runner_missing_interpreter(tmp_path):
    missing = str(tmp_path / "no-such-python")
    proc = subprocess.run([sys.executable, RUNNER, "--stock-python", missing, "--patched-python", missing,
                           "--output", "-"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "--stock-python" in proc.stderr
