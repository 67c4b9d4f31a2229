"""Compare stock and patched torch side by side: fake-mode compile at model scale, and the real path's costs.

Every measurement runs ``benchmarks/worker.py`` in a fresh process (so import, peak RSS and caches are per
process, and every inductor compile gets an empty cache), alternating the stock and the patched interpreter
(A B A B ...). The result is markdown tables of medians, min-max spread and ratios, printed and written to
``benchmarks/RESULTS.md``. Targets from issues 4 and 9 are shown as information (met / not met); nothing fails.

Scenarios (``--scenarios``, default all):
  fake-fwd      preset under FakeTensorMode, forward: eager (no compile), torch.compile with backend eager /
                aot_eager on both torches, inductor on the patched one, stock with
                torch._inductor.config.wrap_inductor_compiled_regions = True (the flag). Two tables: the first
                call, and the steady state (op-by-op calls, the call that builds the regions, the calls after)
  fake-fwdbwd   the same with forward + backward
  estimate      two training steps (forward, loss, backward, AdamW, zero_grad) under FakeTensorMode: eager,
                stock compile eager (the floor), patched compile inductor
  cache-hit     real tensors, compiled function, per-call wall time after warm-up (1 input, 8 inputs, nn.Linear)
  callgrind     the cache-hit calls counted in instructions with valgrind --tool=callgrind, collection on
                only for the N counted calls of each case
  compile-real  first-call inductor compile of the tiny decoder on real tensors (seq 128), fresh cache

Interpreters: ``--stock-python`` (default $TORCH_FORK_OVERLAY_STOCK_PYTHON, else .venv-stock/bin/python) and
``--patched-python`` (default $TORCH_FORK_OVERLAY_PATCHED_PYTHON, else .venv/bin/python), paths relative to the
repository root.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "worker.py")
ALL_SCENARIOS = ["fake-fwd", "cache-hit", "compile-real", "callgrind", "fake-fwdbwd", "estimate"]
ALL_PRESETS = ["tiny", "7B", "70B"]
CACHE_HIT_VARIANTS = ["one", "eight", "linear", "none", "mode", "one-filtered", "eight-filtered", "linear-filtered"]
CACHE_HIT_LABELS = {"one": "1 input", "eight": "8 inputs", "linear": "nn.Linear", "none": "no tensor input",
                    "mode": "1 input, under a non-fake dispatch mode",
                    "one-filtered": "1 input, guard filter", "eight-filtered": "8 inputs, guard filter",
                    "linear-filtered": "nn.Linear, guard filter"}

_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:7.1f}s] {msg}", flush=True)


# --------------------------------------------------------------------------------------------- running workers


class Runner:
    def __init__(self, *, pythons: dict[str, str], log_dir: str, timeout: float, total: int) -> None:
        self.pythons = pythons
        self.log_dir = log_dir
        self.timeout = timeout
        self.total = total
        self.done = 0

    def worker(self, side: str, label: str, worker_args: list[str], **kw) -> dict:
        """Run one worker process; return its JSON, or {"status": "timeout" | "crash" | "error", ...}."""
        return self.workers([(side, label, worker_args)], **kw)[0]

    def workers(self, jobs: list[tuple[str, str, list[str]]], *, timeout: float | None = None,
                wrapper=None, env: dict[str, str] | None = None) -> list[dict]:
        """Run several worker processes at once (only where contention cannot skew the figure, e.g. callgrind).

        ``wrapper`` is a list of argv prefixes, or a function of (side, label) returning one.
        """
        timeout = timeout or self.timeout
        started = []
        for side, label, worker_args in jobs:
            self.done += 1
            cache_dir = tempfile.mkdtemp(prefix="inductor-", dir=self.log_dir)
            full_env = dict(os.environ)
            # A fresh, disabled inductor cache per process: every compile is a cold compile on both sides.
            full_env.update(TORCHINDUCTOR_CACHE_DIR=cache_dir, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1",
                            PYTHONHASHSEED="0")
            full_env.update(env or {})
            prefix = wrapper(side, label) if callable(wrapper) else (wrapper or [])
            cmd = prefix + [self.pythons[side], WORKER] + worker_args
            slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{self.done:03d}-{label}-{side}").strip("-")
            log_path = os.path.join(self.log_dir, slug + ".log")
            log(f"({self.done}/{self.total}) {label} [{side}] ...")
            out = open(log_path, "w")
            out.write("$ " + shlex.join(cmd) + "\n")
            out.flush()
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=REPO,
                                    start_new_session=True)
            started.append((proc, out, log_path, cache_dir, time.perf_counter(), side, label))
        results = []
        for proc, out, log_path, cache_dir, t0, side, label in started:
            try:
                rc = proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
            wall = time.perf_counter() - t0
            out.close()
            shutil.rmtree(cache_dir, ignore_errors=True)
            result: dict = {"wall_s": wall, "log": log_path}
            if rc is None:
                result.update(status="timeout", reason=f"killed after {timeout:.0f}s")
            else:
                with open(log_path) as f:
                    lines = [ln for ln in f if ln.startswith("BENCH_JSON ")]
                if lines:
                    result.update(json.loads(lines[-1][len("BENCH_JSON "):]))
                elif rc < 0:
                    result.update(status="crash", reason=f"signal {-rc} ({signal.Signals(-rc).name})")
                else:
                    result.update(status="error", reason=f"exit {rc}, see {log_path}")
            log(f"    {label} [{side}]: {result['status']} in {wall:.1f}s"
                + (f": {result.get('reason')}" if result["status"] != "ok" else ""))
            results.append(result)
        return results


# --------------------------------------------------------------------------------------------- formatting


def med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt_t(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} µs"


def fmt_spread(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return fmt_t(values[0])
    return f"{fmt_t(med(values))} [{fmt_t(min(values))}–{fmt_t(max(values))}]"


def fmt_ratio(num: float | None, den: float | None) -> str:
    if num is None or den is None or den == 0:
        return "-"
    return f"{num / den:.2f}x"


def target(num: float | None, den: float | None, limit: float) -> str:
    if num is None or den is None or den == 0:
        return "n/a"
    return f"{'met' if num / den <= limit else 'not met'} (≤{limit}x)"


def cell_status(results: list[dict]) -> str | None:
    """None if any run is ok; else the status of the failed runs (timeout, crash, skipped, error)."""
    if any(r["status"] == "ok" for r in results):
        return None
    if not results:
        return "not run"
    return "; ".join(sorted({r["status"] + (f": {r['reason']}" if r.get("reason") and r["status"] in (
        "skipped",) else "") for r in results}))


def ok(results: list[dict]) -> list[dict]:
    return [r for r in results if r["status"] == "ok"]


# --------------------------------------------------------------------------------------------- scenarios

# (key, side, worker --mode, --backend, label). Listed in the order they run: stock and patched alternate.
FAKE_RUNS = [
    ("eager/stock", "stock", "eager", None, "eager, stock"),
    ("eager/patched", "patched", "eager", None, "eager, patched"),
    ("floor", "stock", "compile", "eager", "compile eager, stock (floor)"),
    ("eager-c/patched", "patched", "compile", "eager", "compile eager, patched"),
    ("aot/stock", "stock", "compile", "aot_eager", "compile aot_eager, stock"),
    ("aot/patched", "patched", "compile", "aot_eager", "compile aot_eager, patched"),
    ("flag", "stock", "compile-wrap", "inductor", "flag, stock"),
    ("inductor", "patched", "compile", "inductor", "compile inductor, patched"),
]
FAKE_LABELS = {key: label for key, _, _, _, label in FAKE_RUNS}
# Rows of the first-call table, in reading order.
FIRST_CALL_ROWS = ["eager/stock", "eager/patched", "floor", "eager-c/patched", "inductor", "aot/stock",
                   "aot/patched", "flag"]
# A patched run and the stock run with the same backend: first call and RSS within 1.05x.
SAME_BACKEND = {"eager/patched": "eager/stock", "eager-c/patched": "floor", "aot/patched": "aot/stock"}


def run_fake(runner: Runner, args, *, backward: bool) -> dict:
    name = "fake-fwdbwd" if backward else "fake-fwd"
    data: dict = {}
    for preset in args.presets:
        cells: dict = {}
        for rnd in range(args.fake_repeats(preset)):
            for key, side, mode, backend, _ in FAKE_RUNS:
                wargs = ["fake", "--preset", preset, "--mode", mode, "--repeats", str(args.steady),
                         "--seq", str(args.seq)]
                # Only a chosen value turns regions on; otherwise each worker keeps its torch's default and makes
                # the same number of calls.
                wargs += ["--after-calls", str(args.after_calls)] if args.after_calls is not None else []
                wargs += ["--backend", backend] if backend else []
                wargs += ["--backward"] if backward else []
                what = mode if backend is None else f"{mode} {backend}"
                res = runner.worker(side, f"{name} {preset} {what} round {rnd + 1}", wargs,
                                    timeout=args.preset_timeout(preset))
                cells.setdefault(key, []).append(res)
        data[preset] = cells
    return data


def _pick(results: list[dict], key: str) -> list[float]:
    """The values of one key over the ok runs that have it (a summary dict gives its median)."""
    vals = []
    for r in ok(results):
        v = r.get(key)
        if isinstance(v, dict):
            v = v.get("median")
        if v is not None:
            vals.append(v)
    return vals


def fmt_mb(values: list[float]) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    # RSS barely moves between processes; show the spread only where it does.
    return f"{med(values):.0f}" + (f" [{lo:.0f}–{hi:.0f}]" if hi - lo >= 10 else "")


def ratio_target(num: float | None, den: float | None, limit: float | None = None, what: str = "") -> str:
    r = fmt_ratio(num, den)
    if limit is None or r == "-":
        return r
    return f"{r}, {what}{target(num, den, limit)}"


def _after_calls_note(args, results: list[dict]) -> str:
    seen = sorted({r["after_calls"] for r in ok(results) if r.get("patch_present") and "after_calls" in r})
    n = args.after_calls_used
    if args.after_calls is not None:
        src = f"set by --after-calls; the patched torch's default is {args.after_calls_default}"
    elif args.after_calls_default is None:
        src = "the patched torch's default is None: no regions; the number only sets the calls made"
    else:
        src = "the patched torch's default"
    note = f"after_calls = {n} ({src})"
    if seen and seen != [n]:
        note += f"; the patched workers report {', '.join(map(str, seen))}"
    return note


def table_fake(data: dict, args, *, backward: bool) -> str:
    """Two tables: the first call (compile included) and the steady state, per preset."""
    title = "forward + backward" if backward else "forward"
    everything = [r for cells in data.values() for res in cells.values() for r in res]
    n = args.after_calls_used
    calls = n + 1 + args.steady

    first = [
        "| preset | run | first call | RSS after first call, MB | first call / floor | patched / stock, same backend: "
        "first call, RSS (process peak) | RSS / eager, patched | peak RSS of the process, MB | targets |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    steady = [
        "| preset | compile inductor, patched: op-by-op calls (median) | build call | build / op-by-op | "
        "steady after regions (median) | eager, stock / patched: steady | flag, stock: steady | "
        "steady: inductor / best(eager, flag) | peak RSS of the process, MB: eager p / inductor p / flag s | "
        "peak RSS: inductor / eager |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for preset, cells in data.items():
        get = lambda key, field: med(_pick(cells.get(key, []), field))  # noqa: E731
        floor_first = get("floor", "first_s")
        eager_rss = get("eager/patched", "rss_after_first_mb")
        rss_target = backward and preset == "70B"
        for key in FIRST_CALL_ROWS:
            res = cells.get(key, [])
            st = cell_status(res)
            if st:
                first.append(f"| {preset} | {FAKE_LABELS[key]} | {st} | - | - | - | - | - | |")
                continue
            t, rss = get(key, "first_s"), get(key, "rss_after_first_mb")
            targets = []
            if key in SAME_BACKEND:
                ref = SAME_BACKEND[key]
                same = (f"{fmt_ratio(t, get(ref, 'first_s'))}, {fmt_ratio(rss, get(ref, 'rss_after_first_mb'))} "
                        f"({fmt_ratio(get(key, 'peak_rss_mb'), get(ref, 'peak_rss_mb'))})")
                if key != "eager/patched":
                    targets += [f"time {target(t, get(ref, 'first_s'), 1.05)}",
                                f"RSS {target(rss, get(ref, 'rss_after_first_mb'), 1.05)}"]
            else:
                same = ""
            if key == "inductor":
                targets.append(f"time / floor {target(t, floor_first, 1.15)}")
                if rss_target:
                    targets.append(f"RSS / eager {target(rss, eager_rss, 1.2)}")
            first.append(f"| {preset} | {FAKE_LABELS[key]} | {fmt_spread(_pick(res, 'first_s'))} | "
                         f"{fmt_mb(_pick(res, 'rss_after_first_mb'))} | {fmt_ratio(t, floor_first)} | {same} | "
                         f"{fmt_ratio(rss, eager_rss)} | {fmt_mb(_pick(res, 'peak_rss_mb'))} | {'; '.join(targets)} |")

        ind = cells.get("inductor", [])
        st = cell_status(ind)
        if st:
            ind_cols = [st, "-", "-", "-"]
            ind_steady = None
        else:
            good = ok(ind)
            built = [r["regions_call"] for r in good if r.get("regions_call") is not None]
            op = _pick(ind, "op_by_op_s")
            if built:
                where = sorted({b + 1 for b in built})
                build_vals = [r["split_call_s"] for r in good if r.get("regions_call") is not None]
                build_cell = fmt_spread(build_vals) + f" (call {', '.join(map(str, where))})"
                if len(built) < len(good):
                    build_cell += f"; no regions in {len(good) - len(built)} of {len(good)} processes"
            else:
                build_vals = []
                build_cell = "no regions built"
            splits = sorted({r["split_call"] for r in good})
            op_cell = fmt_spread(op) + (f" (calls 2–{splits[0]})" if len(splits) == 1 and splits[0] > 1 else "")
            ind_steady = med(_pick(ind, "steady_s"))
            ind_cols = [op_cell, build_cell, fmt_ratio(med(build_vals), med(op)) if build_vals else "-",
                        fmt_spread(_pick(ind, "steady_s"))]
        e_s, e_p, fl = (cells.get(k, []) for k in ("eager/stock", "eager/patched", "flag"))
        eager_cell = " / ".join(cell_status(r) or fmt_spread(_pick(r, "steady_s")) for r in (e_s, e_p))
        flag_cell = cell_status(fl) or fmt_spread(_pick(fl, "steady_s"))
        # The better of eager-under-fake (either interpreter) and the flag.
        bests = [v for v in (med(_pick(e_s, "steady_s")), med(_pick(e_p, "steady_s")), med(_pick(fl, "steady_s")))
                 if v is not None]
        best = min(bests) if bests else None
        peaks = [med(_pick(r, "peak_rss_mb")) for r in (e_p, ind, fl)]
        peak_cell = " / ".join("-" if v is None else f"{v:.0f}" for v in peaks)
        peak_ratio = ratio_target(peaks[1], peaks[0], 1.2 if rss_target else None)
        steady.append(f"| {preset} | " + " | ".join(ind_cols) + f" | {eager_cell} | {flag_cell} | "
                      f"{ratio_target(ind_steady, best, 1.1)} | {peak_cell} | {peak_ratio} |")

    head = f"batch 1, seq {args.seq}; {_after_calls_note(args, everything)}: every process makes {n} + 1 + " \
           f"{args.steady} = {calls} calls"
    return (
        f"### Model scale under FakeTensorMode, {title}: first call ({head})\n\n"
        "First call = compile included; RSS = peak RSS of the process after that call (import included); "
        "process peak = at the end of the process, regions included. "
        "floor = stock torch, `backend=\"eager\"`. Targets: compile inductor, patched ≤ 1.15x the floor; "
        "compile eager / aot_eager, patched ≤ 1.05x stock with the same backend, time and RSS"
        + ("; 70B: RSS ≤ 1.2x eager, patched" if backward else "") + ".\n\n"
        + "\n".join(first) + "\n\n"
        f"### Model scale under FakeTensorMode, {title}: steady state ({head})\n\n"
        f"Calls counted from 1 (call 1 compiles). op-by-op = calls 2 to {n} (median); build call = call {n + 1}, "
        f"where the patched torch builds the regions (the table gives the call seen to raise "
        f"`regions_compiled`); steady = the {args.steady} calls after it (median). Eager and flag: the same "
        f"{args.steady} calls. Target: steady inductor ≤ 1.1x best(eager, flag)"
        + ("; 70B peak RSS ≤ 1.2x eager, patched" if backward else "") + ".\n\n"
        + "\n".join(steady) + "\n"
    )


# (key, side, worker --mode, --backend, label), in the order they run.
ESTIMATE_RUNS = [
    ("eager/stock", "stock", "eager", None, "eager, stock"),
    ("eager/patched", "patched", "eager", None, "eager, patched"),
    ("floor", "stock", "compile", "eager", "compile eager, stock (floor)"),
    ("inductor", "patched", "compile", "inductor", "compile inductor, patched"),
]


def run_estimate(runner: Runner, args) -> dict:
    data: dict = {}
    for preset in args.presets:
        cells: dict = {}
        for rnd in range(args.fake_repeats(preset)):
            for key, side, mode, backend, _ in ESTIMATE_RUNS:
                wargs = ["estimate", "--preset", preset, "--mode", mode, "--seq", str(args.seq), "--steps", "2"]
                wargs += ["--backend", backend] if backend else []
                wargs += ["--after-calls", str(args.after_calls)] if args.after_calls is not None else []
                what = mode if backend is None else f"{mode} {backend}"
                res = runner.worker(side, f"estimate {preset} {what} round {rnd + 1}", wargs,
                                    timeout=args.preset_timeout(preset))
                cells.setdefault(key, []).append(res)
        data[preset] = cells
    return data


def table_estimate(data: dict, args) -> str:
    rows = [
        "| preset | " + " | ".join(f"{label}: total (step 1 + step 2)" for *_, label in ESTIMATE_RUNS)
        + " | total: inductor / floor | peak RSS, MB: " + " / ".join(
            ("eager s", "eager p", "floor", "inductor p")) + " | peak RSS: inductor / floor |",
        "|---|" + "---|" * (len(ESTIMATE_RUNS) + 3),
    ]
    regions = 0
    for preset, cells in data.items():
        cols = []
        for key, *_ in ESTIMATE_RUNS:
            res = cells.get(key, [])
            st = cell_status(res)
            if st:
                cols.append(st)
                continue
            good = ok(res)
            regions += sum(1 for r in good if r.get("regions_compiled"))
            steps = [med([r["steps_s"][i] for r in good]) for i in range(len(good[0]["steps_s"]))]
            cols.append(fmt_spread(_pick(res, "total_s")) + " (" + " + ".join(fmt_t(v) for v in steps) + ")")
        get = lambda key, field: med(_pick(cells.get(key, []), field))  # noqa: E731
        total_ratio = ratio_target(get("inductor", "total_s"), get("floor", "total_s"), 1.2)
        peaks = [get(key, "peak_rss_mb") for key, *_ in ESTIMATE_RUNS]
        rows.append(f"| {preset} | " + " | ".join(cols) + f" | {total_ratio} | "
                    + " / ".join("-" if v is None else f"{v:.0f}" for v in peaks)
                    + f" | {fmt_ratio(peaks[3], peaks[2])} |")
    note = ("no process built fake-mode regions (two calls of the model)" if not regions
            else f"{regions} processes built fake-mode regions within the two steps")
    return ("### Two-step training estimate under FakeTensorMode (batch 1, seq "
            f"{args.seq}; forward, cross-entropy, backward, AdamW(foreach=True) step, zero_grad; "
            f"the model compiled or not, the optimizer eager; {note})\n\n"
            "floor = stock torch, `torch.compile(model, backend=\"eager\")`. Target: total, compile inductor "
            "(the default backend), patched ≤ 1.2x the floor.\n\n" + "\n".join(rows) + "\n")


def run_cache_hit(runner: Runner, args) -> dict:
    data: dict = {v: {"stock": [], "patched": []} for v in CACHE_HIT_VARIANTS}
    for rnd in range(args.repeats):
        for variant in CACHE_HIT_VARIANTS:
            for side in ("stock", "patched"):
                wargs = ["cache-hit", "--variant", variant, "--calls", str(args.calls), "--repeats", "5"]
                data[variant][side].append(runner.worker(side, f"cache-hit {variant} round {rnd + 1}", wargs))
    return data


def table_cache_hit(data: dict) -> str:
    rows = ["| case | stock per call | patched per call | patched / stock | target |", "|---|---|---|---|---|"]
    for variant, sides in data.items():
        vals = {s: [r["per_call_s"]["median"] for r in ok(sides[s])] for s in ("stock", "patched")}
        cells = [cell_status(sides[s]) or fmt_spread(vals[s]) for s in ("stock", "patched")]
        p, s = med(vals["patched"]), med(vals["stock"])
        rows.append(f"| {CACHE_HIT_LABELS[variant]} | {cells[0]} | {cells[1]} | {fmt_ratio(p, s)} | "
                    f"{target(p, s, 1.01)} |")
    return ("### Real path, cache hit: wall time per call (median of per-process medians [min–max over processes];"
            " backend inductor, CPU, {calls} calls x 5 blocks per process)\n\n" + "\n".join(rows) + "\n")


def _callgrind_total(path: str) -> int:
    total = None
    with open(path) as f:
        for line in f:
            if line.startswith(("totals:", "summary:")):
                total = int(line.split()[1])
    if total is None:
        raise ValueError(f"no totals line in {path}")
    return total


def run_callgrind(runner: Runner, args) -> dict:
    n = args.callgrind_calls
    outs = {side: os.path.join(runner.log_dir, f"callgrind-{side}.out") for side in ("stock", "patched")}
    # One process per interpreter; collection is on only for the N calls of each variant (dump k = variant k).
    # Instruction counts do not depend on contention, so stock and patched run at the same time.
    wargs = ["callgrind", "--variants", *CACHE_HIT_VARIANTS, "--backend", args.callgrind_backend,
             "--calls", str(n), "--warmup", "200"]
    results = runner.workers(
        [(side, f"callgrind {n} calls x {len(CACHE_HIT_VARIANTS)} cases", wargs) for side in ("stock", "patched")],
        wrapper=lambda side, label: ["valgrind", "--tool=callgrind", "--collect-atstart=no",
                                     f"--callgrind-out-file={outs[side]}"],
        timeout=args.callgrind_timeout)
    data: dict = {v: {} for v in CACHE_HIT_VARIANTS}
    for side, res in zip(("stock", "patched"), results):
        for k, variant in enumerate(CACHE_HIT_VARIANTS, start=1):
            path = f"{outs[side]}.{k}"
            if res["status"] == "ok" and os.path.exists(path):
                data[variant][side] = _callgrind_total(path) / n
            else:
                data[variant][side] = res["status"]
    return data


def table_callgrind(data: dict) -> str:
    rows = ["| case | stock instr/call | patched instr/call | patched / stock |", "|---|---|---|---|"]
    for variant, sides in data.items():
        s, p = sides.get("stock"), sides.get("patched")
        num = lambda v: f"{v:,.0f}" if isinstance(v, float) else str(v)  # noqa: E731
        # Counts repeat to ~0.1%, so a third decimal means something here.
        ratio = f"{p / s:.3f}x" if isinstance(s, float) and isinstance(p, float) and s else "-"
        rows.append(f"| {CACHE_HIT_LABELS[variant]} | {num(s)} | {num(p)} | {ratio} |")
    return ("### Real path, cache hit: instructions per call (valgrind --tool=callgrind, backend {cg_backend},"
            " collection on for N = {cg_calls} calls after compile and warm-up, count / N)\n\n" + "\n".join(rows) + "\n")


def run_compile_real(runner: Runner, args) -> dict:
    data: dict = {"stock": [], "patched": []}
    for rnd in range(args.repeats):
        for side in ("stock", "patched"):
            wargs = ["compile-real", "--seq", "128", "--repeats", "3"]
            data[side].append(runner.worker(side, f"compile-real tiny round {rnd + 1}", wargs))
    return data


def table_compile_real(data: dict) -> str:
    vals = {s: [r["first_s"] for r in ok(data[s])] for s in ("stock", "patched")}
    cells = [cell_status(data[s]) or fmt_spread(vals[s]) for s in ("stock", "patched")]
    p, s = med(vals["patched"]), med(vals["stock"])
    rows = ["| case | stock first call | patched first call | patched / stock | target |", "|---|---|---|---|---|",
            f"| tiny decoder, seq 128, inductor | {cells[0]} | {cells[1]} | {fmt_ratio(p, s)} | "
            f"{target(p, s, 1.01)} |"]
    return ("### Real path, compile: first call with a fresh inductor cache (median [min–max over processes])\n\n"
            + "\n".join(rows) + "\n")


# --------------------------------------------------------------------------------------------- report


def describe_python(py: str) -> dict:
    # 'newest' is the newest modification time of torch's Python files: it tells which state of a patched tree
    # was measured.
    code = ("import glob, json, os, sys, time, torch, torch._dynamo; d = os.path.dirname(torch.__file__); "
            "m = max(os.path.getmtime(f) for f in glob.glob(d + '/**/*.py', recursive=True)); "
            "print(json.dumps({'torch': torch.__version__, 'python': sys.version.split()[0], "
            "'patch': hasattr(torch._dynamo.config, 'inherit_ambient_fake_mode'), 'path': d, "
            "'after_calls': getattr(torch._dynamo.config, 'fake_mode_region_after_calls', None), "
            "'newest': time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(m))}))")
    try:
        out = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {cpu}{mem}, {platform.platform()}"


def default_python(env_var: str, rel: str) -> str:
    return os.environ.get(env_var) or os.path.join(REPO, rel)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stock-python", default=default_python("TORCH_FORK_OVERLAY_STOCK_PYTHON",
                                                                 ".venv-stock/bin/python"))
    parser.add_argument("--patched-python", default=default_python("TORCH_FORK_OVERLAY_PATCHED_PYTHON",
                                                                   ".venv/bin/python"))
    parser.add_argument("--quick", action="store_true",
                        help="tiny preset only, no callgrind, 1 round of the fake-mode scenarios and 2 of the "
                             "real-path ones, fewer calls: a few minutes")
    parser.add_argument("--scenarios", nargs="+", choices=ALL_SCENARIOS, default=None)
    parser.add_argument("--presets", nargs="+", choices=ALL_PRESETS, default=None)
    parser.add_argument("--repeats", type=int, default=None,
                        help="processes per cell and side, alternating stock and patched (default 3; quick: 2, "
                             "and 1 for the tiny preset of the fake-mode scenarios)")
    parser.add_argument("--big-repeats", type=int, default=1, help="rounds for the 7B and 70B presets (default 1)")
    parser.add_argument("--steady", type=int, default=None,
                        help="fake-mode calls measured after the call that builds the regions (default 5, quick 4)")
    parser.add_argument("--after-calls", type=int, default=None,
                        help="set torch._dynamo.config.fake_mode_region_after_calls in every fake-mode worker "
                             "(default: the patched torch's own; shown in the table headers)")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--calls", type=int, default=None, help="calls per timed block in cache-hit")
    parser.add_argument("--callgrind-calls", type=int, default=None, help="N for the callgrind difference")
    parser.add_argument("--callgrind-backend", default="eager",
                        help="backend for the callgrind runs (inductor's compile is very slow under valgrind)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per worker process (tiny, real path)")
    parser.add_argument("--big-timeout", type=float, default=1200, help="seconds per 7B / 70B worker process")
    parser.add_argument("--callgrind-timeout", type=float, default=900)
    parser.add_argument("--output", default=os.path.join(HERE, "RESULTS.md"),
                        help="markdown file to write ('-' to only print)")
    parser.add_argument("--json", default=None, help="also write the raw results as JSON here")
    parser.add_argument("--log-dir", default=None, help="keep worker logs here (default: a temporary directory)")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.scenarios is None:
        args.scenarios = [s for s in ALL_SCENARIOS if s != "callgrind"] if args.quick else ALL_SCENARIOS
    if args.presets is None:
        args.presets = ["tiny"] if args.quick else ALL_PRESETS
    repeats_given = args.repeats is not None
    if args.repeats is None:
        args.repeats = 2 if args.quick else 3
    if args.steady is None:
        args.steady = 4 if args.quick else 5
    if args.steady < 1 or (args.after_calls is not None and args.after_calls < 1):
        parser.error("--steady and --after-calls must be at least 1")
    if args.calls is None:
        args.calls = 300 if args.quick else 2000
    if args.callgrind_calls is None:
        args.callgrind_calls = 1000
    # --quick: the fake-mode scenarios have 8 processes per round (4 for estimate); one round of each is enough
    # to see that everything runs.
    tiny_rounds = 1 if args.quick and not repeats_given else args.repeats
    args.fake_repeats = lambda p: tiny_rounds if p == "tiny" else args.big_repeats
    args.preset_timeout = lambda p: args.timeout if p == "tiny" else args.big_timeout
    return args


def count_workers(args) -> int:
    n = 0
    for s in args.scenarios:
        if s.startswith("fake-"):
            n += sum(args.fake_repeats(p) for p in args.presets) * len(FAKE_RUNS)
        elif s == "estimate":
            n += sum(args.fake_repeats(p) for p in args.presets) * len(ESTIMATE_RUNS)
        elif s == "cache-hit":
            n += args.repeats * len(CACHE_HIT_VARIANTS) * 2
        elif s == "callgrind":
            n += 2
        elif s == "compile-real":
            n += args.repeats * 2
    return n


def repo_relative(text: str) -> str:
    """A path in a report, as a reader of the repository can use it: relative to
    the repository when inside it, else only its last part (a scratch folder)."""
    def one(path: str) -> str:
        if not os.path.isabs(path):
            return path
        rel = os.path.relpath(path, REPO)
        return rel if not rel.startswith("..") else f"<outside the repository>/{os.path.basename(path)}"
    return re.sub(r"(?<![\w.])/[^\s`'\",]+", lambda m: one(m.group(0)), text)


def make_report(args, pythons: dict, info: dict, sections: list[str], durations: list) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = [
        "# Benchmark results",
        "",
        f"- Date: {now}",
        f"- Command: `python benchmarks/run.py {repo_relative(shlex.join(args.argv))}`",
        f"- Machine: {machine()}",
    ]
    for side in ("stock", "patched"):
        i = info[side]
        desc = (f"torch {i.get('torch')}, Python {i.get('python')}, patch present: {i.get('patch')}, "
                f"newest torch .py file modified {i.get('newest')}" if "error" not in i else i["error"])
        header.append(f"- {side}: `{repo_relative(pythons[side])}`: {desc}")
    after = info["patched"].get("newest_after", {})
    if any(v != info["patched"].get("newest") for v in after.values()):
        header.append("- The patched tree changed during the run; newest torch .py file after each scenario: "
                      + ", ".join(f"{s} {v}" for s, v in after.items()))
    header.append("- Scenario wall times: " + ", ".join(f"{s} {d:.0f} s" for s, d in durations))
    pending = [s for s in args.scenarios if s not in {d[0] for d in durations}]
    if pending:
        header.append("- Not finished yet: " + ", ".join(pending))
    header += ["", "Times are medians over processes [min–max]; 'first' is the first call (compile included), "
               "'steady' the median of the calls after the one that builds the fake-mode regions. Targets are "
               "issues 4 and 9's, shown as information. See benchmarks/README.md for what each column "
               "measures.", ""]
    return "\n".join(header) + "\n" + "\n".join(sections)


def main(argv=None) -> int:
    args = parse_args(argv)
    pythons = {"stock": args.stock_python, "patched": args.patched_python}
    for side, py in pythons.items():
        if not os.path.exists(py):
            print(f"error: the {side} interpreter {py} does not exist.\n"
                  f"  Make the environments with tools/quickstart, or pass --{side}-python PATH "
                  f"(or set TORCH_FORK_OVERLAY_{side.upper()}_PYTHON).", file=sys.stderr)
            return 2
    if "callgrind" in args.scenarios and not shutil.which("valgrind"):
        print("error: the callgrind scenario needs valgrind on PATH; drop it with --scenarios.", file=sys.stderr)
        return 2
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="torch-fake-bench-")
    os.makedirs(log_dir, exist_ok=True)
    log(f"worker logs in {log_dir}")
    info = {side: describe_python(py) for side, py in pythons.items()}
    for side in pythons:
        log(f"{side}: {pythons[side]} -> {info[side]}")
    # The op-by-op calls before the regions: the patched torch's default unless --after-calls; every fake-mode
    # worker, stock ones included, gets it so both sides make the same calls.
    args.after_calls_default = info["patched"].get("after_calls")
    args.after_calls_used = args.after_calls or args.after_calls_default or 16
    runner = Runner(pythons=pythons, log_dir=log_dir, timeout=args.timeout, total=count_workers(args))
    sections, durations, raw = [], [], {}
    fmt = {"seq": args.seq, "calls": args.calls, "cg_backend": args.callgrind_backend,
           "cg_calls": args.callgrind_calls}
    for scenario in args.scenarios:
        log(f"=== {scenario}")
        t0 = time.perf_counter()
        if scenario == "fake-fwd":
            data = run_fake(runner, args, backward=False)
            sections.append(table_fake(data, args, backward=False))
        elif scenario == "fake-fwdbwd":
            data = run_fake(runner, args, backward=True)
            sections.append(table_fake(data, args, backward=True))
        elif scenario == "estimate":
            data = run_estimate(runner, args)
            sections.append(table_estimate(data, args))
        elif scenario == "cache-hit":
            data = run_cache_hit(runner, args)
            sections.append(table_cache_hit(data).format(**fmt))
        elif scenario == "callgrind":
            data = run_callgrind(runner, args)
            sections.append(table_callgrind(data).format(**fmt))
        else:
            data = run_compile_real(runner, args)
            sections.append(table_compile_real(data).format(**fmt))
        raw[scenario] = data
        # A patched tree under development may change during a run: note its state after every scenario.
        info["patched"].setdefault("newest_after", {})[scenario] = describe_python(pythons["patched"]).get("newest")
        durations.append((scenario, time.perf_counter() - t0))
        log(f"=== {scenario} took {durations[-1][1]:.0f}s")
        # Written after every scenario, so an interrupted run still leaves the finished tables.
        report = make_report(args, pythons, info, sections, durations)
        if args.output != "-":
            with open(args.output, "w") as f:
                f.write(report)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": args.argv, "info": info, "results": raw}, f, indent=1, default=str)
    print()
    print(report)
    if args.output != "-":
        log(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
