"""Issue 18's cost targets: what a fake call that runs the backend's graphs costs.

A preset's forward+backward under a FakeTensorMode, compiled, first call and the
calls after it, each measured in fresh worker processes (benchmarks/worker.py
fake --backward), stock and patched alternating:

  patched inductor            vs stock anchor (Inductor's graph pipeline without lowering:
                              compile_fx with an inner compile that returns the graph)   target <= 1.05
  patched aot_eager           vs stock aot_eager                                        target <= 1.1
  patched inductor, op by op  vs stock eager backend                                    target <= 1.05
  (fake_mode_runs_backend_graphs = False)

Peak RSS targets: <= 1.1x the same references. A benchmark prints figures; it
never passes or fails. Run it on a quiet machine:

    python benchmarks/fidelity.py --presets 7B --rounds 3
    python benchmarks/fidelity.py --presets tiny --rounds 1      # a smoke run

With --count-calls it also counts, in one more process per row, the function
calls of the first call (cProfile): the work done, which the machine's load does
not change, for telling a real difference from noise in the times.

It writes the table to benchmarks/RESULTS-fidelity.md (--output - to only print).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# (label, side, backend, extra worker flags), and the reference row each is compared with.
ROWS = [
    ("stock anchor", "stock", "anchor", []),
    ("patched inductor", "patched", "inductor", []),
    ("stock aot_eager", "stock", "aot_eager", []),
    ("patched aot_eager", "patched", "aot_eager", []),
    ("stock eager backend", "stock", "eager", []),
    ("patched inductor, op by op", "patched", "inductor", ["--op-by-op"]),
]
PAIRS = [
    ("patched inductor", "stock anchor", 1.05),
    ("patched aot_eager", "stock aot_eager", 1.1),
    ("patched inductor, op by op", "stock eager backend", 1.05),
]


def fake_call_args(preset: str, backend: str, extra: list[str]) -> list[str]:
    """`worker.py fake` arguments of a row: the preset's forward+backward, compiled with backend."""
    return ["--preset", preset, "--mode", "compile", "--backend", backend, "--backward", *extra]


def run_worker(python: str, worker_args: list[str], timeout: float) -> dict:
    """One `worker.py fake` process with an empty inductor cache; its BENCH_JSON result."""
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-fidelity-")
    env["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
    cmd = [python, os.path.join(HERE, "worker.py"), "fake", *worker_args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "timeout"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_JSON ")]
    if proc.returncode or not lines:
        return {"status": f"failed (exit {proc.returncode})", "stderr": proc.stderr[-2000:]}
    return json.loads(lines[-1][len("BENCH_JSON "):])


def write_table(lines: list[str], output: str) -> None:
    """Print the table and write it to output ('-': only print)."""
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if output != "-":
        with open(output, "w") as f:
            f.write(text)
        print(f"written to {os.path.relpath(output, REPO)}")


def median(results: list[dict], key: str) -> float | None:
    values = [r[key] for r in results if r.get("status") == "ok" and r.get(key) is not None]
    return statistics.median(values) if values else None


def later_calls(result: dict) -> float:
    return statistics.median(result["calls_s"][1:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["7B"], choices=["tiny", "7B", "70B"])
    parser.add_argument("--rounds", type=int, default=3, help="worker processes per row and preset")
    parser.add_argument("--stock-python", default=os.environ.get("TORCH_FORK_OVERLAY_STOCK_PYTHON",
                                                                 os.path.join(REPO, ".venv-stock/bin/python")))
    parser.add_argument("--patched-python", default=os.environ.get("TORCH_FORK_OVERLAY_PATCHED_PYTHON",
                                                                   os.path.join(REPO, ".venv/bin/python")))
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per worker process")
    parser.add_argument("--output", default=os.path.join(HERE, "RESULTS-fidelity.md"),
                        help="where to write the table ('-': only print)")
    parser.add_argument("--count-calls", action="store_true",
                        help="also count the first call's function calls per row (one process each, cProfile)")
    args = parser.parse_args(argv)
    pythons = {"stock": args.stock_python, "patched": args.patched_python}
    started = time.perf_counter()
    data: dict[str, dict[str, list[dict]]] = {}
    for preset in args.presets:
        data[preset] = {label: [] for label, *_ in ROWS}
        for round_ in range(args.rounds):
            for label, side, backend, extra in ROWS:
                t0 = time.perf_counter()
                result = run_worker(pythons[side], fake_call_args(preset, backend, [
                    "--after-calls", "1", "--repeats", "2", *extra]), args.timeout)
                if result.get("status") == "ok":
                    result["later_s"] = later_calls(result)
                data[preset][label].append(result)
                print(f"[{time.perf_counter() - started:7.0f}s] {preset} round {round_ + 1}/{args.rounds} "
                      f"{label}: {result.get('status')} (first call {result.get('first_s', float('nan')):.2f} s, "
                      f"{time.perf_counter() - t0:.0f} s in all)", flush=True)
    counts: dict[str, dict[str, int | None]] = {}
    for preset in args.presets if args.count_calls else []:
        counts[preset] = {}
        for label, side, backend, extra in ROWS:
            result = run_worker(pythons[side], fake_call_args(preset, backend, ["--count-calls", *extra]),
                                args.timeout)
            counts[preset][label] = result.get("first_call_py_calls")
            print(f"[{time.perf_counter() - started:7.0f}s] {preset} {label}: "
                  f"{counts[preset][label]} function calls in the first call", flush=True)
    lines = [
        "# A fake call that runs the backend's graphs: cost (issue 18)",
        "",
        f"{datetime.date.today()}, `python benchmarks/fidelity.py {' '.join(argv or sys.argv[1:])}`, "
        f"{platform.machine()}, {os.cpu_count()} cores; stock `{os.path.relpath(args.stock_python, REPO)}`, "
        f"patched `{os.path.relpath(args.patched_python, REPO)}`. Forward+backward of `mean(logits)` under a "
        "FakeTensorMode, seq 2048, float32; medians over worker processes (a fresh process each, empty inductor "
        "cache). First call: Dynamo's trace, the backend's pipeline and the run; later calls: the median of the "
        "calls after it.",
        "",
        "| preset | row | first call | later calls | peak RSS | vs | first call ratio | peak RSS ratio | target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for preset, rows in data.items():
        for label, reference, limit in PAIRS:
            first, ref_first = median(rows[label], "first_s"), median(rows[reference], "first_s")
            rss, ref_rss = median(rows[label], "peak_rss_mb"), median(rows[reference], "peak_rss_mb")
            later = median(rows[label], "later_s")
            ratio = first / ref_first if first and ref_first else None
            rss_ratio = rss / ref_rss if rss and ref_rss else None
            verdict = "n/a" if ratio is None else (
                f"time {'met' if ratio <= limit else 'NOT met'} (<= {limit}), "
                f"RSS {'met' if rss_ratio is not None and rss_ratio <= 1.1 else 'NOT met'} (<= 1.1)")
            fmt = lambda v, unit: "n/a" if v is None else f"{v:.2f} {unit}"  # noqa: E731
            lines.append(
                f"| {preset} | {label} | {fmt(first, 's')} | {fmt(later, 's')} | {fmt(rss, 'MB')} | {reference}: "
                f"{fmt(ref_first, 's')}, {fmt(ref_rss, 'MB')} | {fmt(ratio, 'x')} | {fmt(rss_ratio, 'x')} | "
                f"{verdict} |")
    if counts:
        lines += [
            "",
            "Function calls in the first call (cProfile, one process per row; the work done, unchanged by load):",
            "",
            "| preset | row | function calls | vs | ratio |",
            "|---|---|---|---|---|",
        ]
        for preset, rows in counts.items():
            for label, reference, _ in PAIRS:
                n, ref = rows.get(label), rows.get(reference)
                ratio = f"{n / ref:.4f} x" if n and ref else "n/a"
                lines.append(f"| {preset} | {label} | {n if n else 'n/a':,} | {reference}: "
                             f"{ref if ref else 'n/a':,} | {ratio} |")
    write_table(lines, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
