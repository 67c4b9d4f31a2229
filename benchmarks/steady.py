"""Issue 18's steady-state target: what a repeated fake call of a compiled model costs.

A preset under a FakeTensorMode, compiled, called 17 + --calls times in one worker process (benchmarks/worker.py
fake, regions off; 2 + --calls times in the regions rows); the steady call is the median of the calls after the first
two, or after the call that built the regions (the first compiles and runs under
AOTAutograd's one-off analysis mode, the second records what the graphs made). Rows:

  flag, stock          torch._inductor.config.wrap_inductor_compiled_regions = True: upstream's way to get fake
                       outputs from inductor, its compiled region one FakeTensorMode dispatch-cache hit a call
  patched inductor     the backend's unlowered graphs, replayed from what an earlier call made    target <= 1.1x flag
  patched aot_eager    the same for aot_eager                                                      target <= 1.1x flag
  patched, op by op    fake_mode_runs_backend_graphs = False (inductor): the captured graph op by op, for reference
  patched eager        backend eager: Dynamo's captured graph op by op (the replay serves only a backend's graphs)
  patched eager, regions   the same with the opt-in regions (fake_mode_region_after_calls = 1): from the second
                       call on, a forward autograd does not record is one region, a FakeTensorMode dispatch-cache hit
  patched custom[, regions]   the same for a user's backend that returns gm.forward

Forward alone runs under torch.no_grad(), as people estimate inference; --backward adds the backward of
mean(logits). A benchmark prints figures; it never passes or fails. Run it on a quiet machine:

    python benchmarks/steady.py --presets tiny 7B --rounds 1
    python benchmarks/steady.py --presets tiny --rounds 1 --output -      # a smoke run, printed only

It writes the table to benchmarks/RESULTS-steady.md (--output - to only print).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from fidelity import run_worker, write_table  # noqa: E402

# (label, side, worker flags)
ROWS = [
    ("flag, stock", "stock", ["--mode", "compile-wrap"]),
    ("patched inductor", "patched", ["--mode", "compile", "--backend", "inductor"]),
    ("patched aot_eager", "patched", ["--mode", "compile", "--backend", "aot_eager"]),
    ("patched, op by op", "patched", ["--mode", "compile", "--backend", "inductor", "--op-by-op"]),
    # The entries the replay does not serve (they run Dynamo's graph op by op), without and with the opt-in regions;
    # forward only: regions serve only calls autograd does not record (forward+backward runs op by op either way).
    ("patched eager", "patched", ["--mode", "compile", "--backend", "eager"]),
    ("patched eager, regions", "patched", ["--mode", "compile", "--backend", "eager", "--after-calls", "1"]),
    ("patched custom", "patched", ["--mode", "compile", "--backend", "custom"]),
    ("patched custom, regions", "patched", ["--mode", "compile", "--backend", "custom", "--after-calls", "1"]),
]
FORWARD_ONLY = {"patched eager", "patched eager, regions", "patched custom", "patched custom, regions"}
TARGETS = {"patched inductor": 1.1, "patched aot_eager": 1.1}


def steady_call(result: dict) -> float:
    # The calls after the one that built the regions, where a row builds them; else all but the first two.
    built = result.get("regions_call")
    return statistics.median(result["calls_s"][2 if built is None else built + 1:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny", "7B"], choices=["tiny", "7B", "70B"])
    parser.add_argument("--rounds", type=int, default=1, help="worker processes per row, preset and pass")
    parser.add_argument("--calls", type=int, default=3,
                        help="calls per process after the worker's 17 (all but the first two count as steady)")
    parser.add_argument("--stock-python", default=os.environ.get("TORCH_FORK_OVERLAY_STOCK_PYTHON",
                                                                 os.path.join(REPO, ".venv-stock/bin/python")))
    parser.add_argument("--patched-python", default=os.environ.get("TORCH_FORK_OVERLAY_PATCHED_PYTHON",
                                                                   os.path.join(REPO, ".venv/bin/python")))
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per worker process")
    parser.add_argument("--output", default=os.path.join(HERE, "RESULTS-steady.md"),
                        help="where to write the table ('-': only print)")
    args = parser.parse_args(argv)
    pythons = {"stock": args.stock_python, "patched": args.patched_python}
    started = time.perf_counter()
    passes = [("forward", []), ("forward+backward", ["--backward"])]
    data: dict[tuple[str, str], dict[str, list[float]]] = {}
    for preset in args.presets:
        for pass_name, pass_flags in passes:
            cell = data[(preset, pass_name)] = {label: [] for label, *_ in ROWS}
            for round_ in range(args.rounds):
                for label, side, flags in ROWS:
                    if pass_flags and label in FORWARD_ONLY:
                        continue
                    # Regions stay off unless a row turns them on (--after-calls): the process makes
                    # after_calls + 1 + N calls.
                    result = run_worker(pythons[side], ["--preset", preset, *flags, *pass_flags,
                                                        "--repeats", str(args.calls)], args.timeout)
                    status = result.get("status")
                    if status == "ok":
                        cell[label].append(steady_call(result))
                    print(f"[{time.perf_counter() - started:6.0f}s] {preset} {pass_name} {label} "
                          f"round {round_ + 1}: {status}"
                          + (f", steady {cell[label][-1] * 1e3:.2f} ms" if status == "ok" else ""), flush=True)
    lines = [
        "# A repeated fake call: steady-state cost (issues 18 and 28)",
        "",
        f"{datetime.date.today()}, `python benchmarks/steady.py {' '.join(argv or sys.argv[1:])}`, "
        f"{platform.machine()}, {os.cpu_count()} cores; stock `{os.path.relpath(args.stock_python, REPO)}`, "
        f"patched `{os.path.relpath(args.patched_python, REPO)}`. Batch 1, seq 2048, float32, under a "
        "FakeTensorMode; steady call = median of the calls after the first two (regions rows: after the call "
        "that built the regions) in a process, then the median "
        "over processes.",
        "",
        "| preset | pass | row | steady call | vs flag | target |",
        "|---|---|---|---|---|---|",
    ]
    for (preset, pass_name), cell in data.items():
        flag = statistics.median(cell["flag, stock"]) if cell["flag, stock"] else None
        for label, *_ in ROWS:
            if pass_name != "forward" and label in FORWARD_ONLY:
                continue
            value = statistics.median(cell[label]) if cell[label] else None
            ratio = value / flag if value is not None and flag else None
            limit = TARGETS.get(label)
            verdict = "" if limit is None or ratio is None else (
                f"{'met' if ratio <= limit else 'NOT met'} (<= {limit}x)")
            lines.append(f"| {preset} | {pass_name} | {label} | "
                         f"{'n/a' if value is None else f'{value * 1e3:.2f} ms'} | "
                         f"{'' if ratio is None else f'{ratio:.2f}x'} | {verdict} |")
    lines += record_cost(args.presets, pythons["patched"], args.timeout, started)
    write_table(lines, args.output)
    return 0


def record_cost(presets: list[str], python: str, timeout: float, started: float) -> list[str]:
    """What the replay's record costs the calls that make it: function calls (cProfile, load-independent) of the
    first two calls of patched inductor, each in a process of its own, with the record as shipped and a no-op."""
    lines = ["", "What recording costs (patched inductor; function calls of one call, cProfile; the record is made "
             "on the second call, the first runs under AOTAutograd's one-off analysis):", "",
             "| preset | pass | call | with the record | record a no-op | ratio | target |", "|---|---|---|---|---|---|---|"]
    for preset in presets:
        for pass_name, pass_flags in [("forward", []), ("forward+backward", ["--backward"])]:
            for index in ((0, 1) if not pass_flags else (1,)):
                counts = []
                for extra in ([], ["--no-record"]):
                    result = run_worker(python, ["--preset", preset, "--mode", "compile", "--backend", "inductor",
                                                 *pass_flags, "--count-calls", "--count-call-index", str(index),
                                                 *extra], timeout)
                    counts.append(result.get("first_call_py_calls"))
                    print(f"[{time.perf_counter() - started:6.0f}s] {preset} {pass_name} call {index + 1} "
                          f"{'no-op record' if extra else 'record'}: {result.get('status')}", flush=True)
                with_record, without = counts
                ratio = with_record / without if with_record and without else None
                shown = [f"{n:,}" if n else "n/a" for n in counts]
                lines.append(f"| {preset} | {pass_name} | {index + 1} | {shown[0]} | "
                             f"{shown[1]} | {'' if ratio is None else f'{ratio:.4f}x'} | "
                             f"{'' if ratio is None else ('met' if ratio <= 1.01 else 'NOT met')} (<= 1.01x) |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
