"""Smoke test of the benchmark harness: one tiny worker run per scenario, minimal sizes, checked for sane JSON.

This guards benchmarks/ against bit-rot; it measures nothing. It runs the worker on the interpreter running pytest
(skipped where that interpreter has no torch) with the eager / aot_eager backends so it takes seconds, not an
inductor compile, and renders run.py's tables from made-up results.
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
@pytest.mark.parametrize("mode,extra", [("eager", []), ("compile", ["--backend", "aot_eager", "--backward"]),
                                        ("compile", ["--backend", "eager"]), ("compile", ["--backend", "custom"])])
def test_fake_tiny(mode, extra):
    result = run_worker("fake", "--preset", "tiny", "--mode", mode, "--seq", "16", "--repeats", "1",
                        "--after-calls", "2", *extra)
    check_common(result)
    assert result["out_type"] == "FakeTensor"
    assert result["out_shape"] == [1, 16, 32000]
    assert result["after_calls"] == 2
    # after_calls op-by-op calls (the first compiles), the call that builds the regions, --repeats more.
    assert len(result["calls_s"]) == len(result["rss_after_call_mb"]) == 2 + 1 + 1
    assert result["first_s"] == result["calls_s"][0]
    assert 0 < result["first_s"] < 120
    assert result["rss_after_first_mb"] <= result["peak_rss_mb"]
    assert result["steady_s"]["n"] == 1
    assert 0 < result["steady_s"]["min"] <= result["steady_s"]["median"] <= result["steady_s"]["max"]
    assert result["split_call_s"] == result["calls_s"][result["split_call"]]
    if result["regions_call"] is not None:
        assert result["patch_present"] and mode == "compile"
        assert result["regions_compiled"] >= 1 and result["split_call"] == result["regions_call"]
    else:
        assert result["split_call"] == 2
        # A patched torch builds the regions of an inference entry once --after-calls asks for them.
        assert not (result["patch_present"] and mode == "compile" and "--backward" not in extra), result
    if mode == "compile":
        assert result["graphs"] >= 1


@needs_torch
def test_fake_count_calls_of_the_recording_call():
    # The second call records what the graphs made (patched torch): counted with the record as shipped and a no-op.
    counts = []
    for extra in ([], ["--no-record"]):
        result = run_worker("fake", "--preset", "tiny", "--mode", "compile", "--backend", "aot_eager", "--seq", "16",
                            "--count-calls", "--count-call-index", "1", *extra)
        check_common(result)
        if not result["patch_present"]:
            pytest.skip("stock torch has no replay")
        assert len(result["calls_s"]) == 2 and result["counted_call"] == 1
        counts.append(result["first_call_py_calls"])
    assert counts[0] > counts[1] > 1_000, counts


@needs_torch
def test_fake_count_calls():
    # One call, under cProfile: the same work twice gives the same count (what makes it a measure under load).
    counts = []
    for _ in range(2):
        result = run_worker("fake", "--preset", "tiny", "--mode", "compile", "--backend", "eager", "--seq", "16",
                            "--backward", "--count-calls")
        check_common(result)
        assert len(result["calls_s"]) == 1 and result["steady_s"] is None
        counts.append(result["first_call_py_calls"])
    assert counts[0] > 10_000
    assert abs(counts[0] - counts[1]) <= counts[0] // 1000, counts


@needs_torch
def test_fake_stock_inductor_is_skipped_not_run():
    result = run_worker("fake", "--preset", "tiny", "--mode", "compile", "--backend", "inductor", "--seq", "16",
                        "--repeats", "1", "--after-calls", "1")
    if result["patch_present"]:
        pytest.skip("a patched torch runs inductor under fake mode; that is an inductor compile, not seconds")
    assert result["status"] == "skipped" and "segfault" in result["reason"]


@needs_torch
@pytest.mark.parametrize("mode,extra", [("eager", []), ("compile", ["--backend", "eager"])])
def test_estimate_tiny(mode, extra):
    result = run_worker("estimate", "--preset", "tiny", "--mode", mode, "--seq", "16", *extra)
    check_common(result)
    assert result["loss_type"] == "FakeTensor"
    assert len(result["steps_s"]) == len(result["rss_after_step_mb"]) == 2
    assert result["total_s"] == pytest.approx(sum(result["steps_s"]))
    # AdamW's state: step, exp_avg, exp_avg_sq per parameter.
    assert result["optimizer_state_tensors"] > 0 and result["optimizer_state_tensors"] % 3 == 0
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
    assert result["variants"] == [
        "one", "eight", "linear", "none", "mode", "one-filtered", "eight-filtered", "linear-filtered"
    ]
    # Each variant compiles its own entry (a filtered one must not share the unfiltered one's).
    assert result["graphs"] == 8


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


def _load_runner():
    spec = importlib.util.spec_from_file_location("bench_run", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_runner_tables_render():
    # The tables from made-up worker results (ok, skipped, timeout): run.py's formatting against the worker's keys,
    # without starting a process.
    run = _load_runner()
    args = run.parse_args(["--quick"])
    args.after_calls_default = args.after_calls_used = 3
    calls = [1.0, 0.1, 0.1, 2.0] + [0.01] * args.steady

    def fake(key, side, mode, backend, preset):
        if preset == "70B" and key == "flag":
            return {"status": "timeout", "reason": "killed after 1s"}
        built = side == "patched" and mode == "compile"
        return {"status": "ok", "patch_present": side == "patched", "after_calls": 3, "calls_s": calls,
                "first_s": calls[0], "rss_after_first_mb": 700.0, "peak_rss_mb": 760.0 if built else 700.0,
                "regions_call": 3 if built else None, "split_call": 3, "split_call_s": calls[3],
                "op_by_op_s": {"median": 0.1}, "steady_s": {"median": 0.01 if built else 0.1}}

    data = {p: {k: [fake(k, s, m, b, p)] for k, s, m, b, _ in run.FAKE_RUNS} for p in ("tiny", "70B")}
    for backward in (False, True):
        text = run.table_fake(data, args, backward=backward)
        assert "after_calls = 3" in text and "| 70B | flag, stock | timeout |" in text
        assert "(call 4)" in text and "not met" not in text
        assert text.count("\n| tiny |") == len(run.FIRST_CALL_ROWS) + 1
        assert ("RSS / eager met (≤1.2x)" in text) == backward

    est = {"tiny": {k: [{"status": "ok", "steps_s": [1.0, 0.2], "total_s": 1.2, "peak_rss_mb": 800.0,
                         "regions_compiled": 0}] for k, *_ in run.ESTIMATE_RUNS}}
    text = run.table_estimate(est, args)
    assert "1.00x, met (≤1.2x)" in text and "1.20 s (1.00 s + 200.0 ms)" in text
    est["tiny"]["inductor"] = [{"status": "skipped", "reason": "stock torch"}]
    assert "skipped: stock torch" in run.table_estimate(est, args)


def test_report_names_paths_relative_to_the_repository():
    spec = importlib.util.spec_from_file_location("bench_run", RUNNER)
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    line = (f"--stock-python {REPO}/.venv-stock/bin/python --patched-python {REPO}/.venv/bin/python "
            "--log-dir /tmp/bench-logs --json /tmp/x/bench.json")
    assert run.repo_relative(line) == (
        "--stock-python .venv-stock/bin/python --patched-python .venv/bin/python "
        "--log-dir <outside the repository>/bench-logs --json <outside the repository>/bench.json")
    # the committed report: no absolute path in its header
    with open(os.path.join(REPO, "benchmarks", "RESULTS.md")) as f:
        header = f.read().split("Times are medians", 1)[0]
    assert REPO not in header and "/work/" not in header and "/tmp/" not in header


@needs_torch
def test_inductor_memory_smoke():
    # One case at a small size: the table renders, the planned fake call is the real run's.
    script = os.path.join(REPO, "benchmarks", "inductor_memory.py")
    check = "import torch._dynamo.config as c; print(hasattr(c, 'fake_mode_plans_inductor_buffers'))"
    if subprocess.run([sys.executable, "-c", check], capture_output=True, text=True).stdout.strip() != "True":
        pytest.skip("torch without fake_mode_plans_inductor_buffers")
    proc = subprocess.run([sys.executable, script, "--cases", "mlp_no_grad", "--scale", "0.05", "--report"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| MLP")]
    assert len(rows) == 1, proc.stdout
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert len(cells) == 8, cells
    real_inductor, planned = cells[4], cells[6]
    assert planned == f"{real_inductor} (1.00x)", cells
    # --report: the forward graph's planned peak, its buffers with their modules.
    assert " forward: planned peak" in proc.stdout, proc.stdout
    assert any(ln.split()[-1] == "down" for ln in proc.stdout.splitlines() if "MiB" in ln), proc.stdout
