"""Compare stock and patched torch side by side: fake-mode compile at model scale, and the real path's costs.

Every measurement runs ``benchmarks/worker.py`` in a fresh process (so import, peak RSS and caches are per
process, and every inductor compile gets an empty cache), alternating the stock and the patched interpreter
(A B A B ...). The result is a markdown table of medians, min-max spread and ratios, printed and written to
``benchmarks/RESULTS.md``. Targets from issue 4 are shown as information (met / not met); nothing fails.

Scenarios (``--scenarios``, default all):
  fake-fwd      preset under FakeTensorMode, forward: eager, torch.compile (patched), stock with
                torch._inductor.config.wrap_inductor_compiled_regions = True
  fake-fwdbwd   the same with forward + backward
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
ALL_SCENARIOS = ["fake-fwd", "cache-hit", "compile-real", "callgrind", "fake-fwdbwd"]
ALL_PRESETS = ["tiny", "7B", "70B"]
CACHE_HIT_VARIANTS = ["one", "eight", "linear"]
CACHE_HIT_LABELS = {"one": "1 input", "eight": "8 inputs", "linear": "nn.Linear"}

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

FAKE_COLUMNS = [  # (key, side, worker --mode)
    ("eager", "stock", "eager"),
    ("eager", "patched", "eager"),
    ("compile", "patched", "compile"),
    ("wrap", "stock", "compile-wrap"),
]


def run_fake(runner: Runner, args, *, backward: bool) -> dict:
    name = "fake-fwdbwd" if backward else "fake-fwd"
    data: dict = {}
    for preset in args.presets:
        cells: dict = {}
        for rnd in range(args.fake_repeats(preset)):
            for key, side, mode in FAKE_COLUMNS:
                wargs = ["fake", "--preset", preset, "--mode", mode, "--repeats", str(args.steady),
                         "--seq", str(args.seq)] + (["--backward"] if backward else [])
                res = runner.worker(side, f"{name} {preset} {mode} round {rnd + 1}", wargs,
                                    timeout=args.preset_timeout(preset))
                cells.setdefault(f"{key}/{side}", []).append(res)
        data[preset] = cells
    return data


def table_fake(data: dict, *, backward: bool) -> str:
    rows = [
        "| preset | eager, stock: first / steady | eager, patched: first / steady | "
        "compile, patched: first / steady | flag, stock: first / steady | "
        "first: compile / flag | steady: compile / best(eager, flag) | peak RSS MB: eager p / compile p / flag s | "
        "RSS: compile / eager |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for preset, cells in data.items():
        cols = []
        firsts: dict = {}
        steadies: dict = {}
        rss: dict = {}
        for key, side, _ in FAKE_COLUMNS:
            res = cells.get(f"{key}/{side}", [])
            st = cell_status(res)
            good = ok(res)
            firsts[key, side] = med([r["first_s"] for r in good])
            steadies[key, side] = med([r["steady_s"]["median"] for r in good])
            rss[key, side] = med([r["peak_rss_mb"] for r in good])
            if st:
                cols.append(st)
            else:
                cols.append(fmt_spread([r["first_s"] for r in good]) + " / "
                            + fmt_spread([r["steady_s"]["median"] for r in good]))
        c_first, c_steady = firsts["compile", "patched"], steadies["compile", "patched"]
        w_first = firsts["wrap", "stock"]
        bests = [s for s in (steadies["eager", "patched"], steadies["eager", "stock"], steadies["wrap", "stock"])
                 if s is not None]
        # The better of eager-under-fake and the flag; eager counts on either interpreter.
        best = min(bests) if bests else None
        first_ratio = fmt_ratio(c_first, w_first) + ", " + target(c_first, w_first, 0.5)
        steady_ratio = fmt_ratio(c_steady, best) + ", " + target(c_steady, best, 1.1)
        rss_cell = " / ".join("-" if rss[k] is None else f"{rss[k]:.0f}"
                              for k in (("eager", "patched"), ("compile", "patched"), ("wrap", "stock")))
        rss_ratio = fmt_ratio(rss["compile", "patched"], rss["eager", "patched"])
        if backward and preset == "70B":
            rss_ratio += ", " + target(rss["compile", "patched"], rss["eager", "patched"], 1.25)
        rows.append(f"| {preset} | " + " | ".join(cols) + f" | {first_ratio} | {steady_ratio} | {rss_cell} | "
                    f"{rss_ratio} |")
    title = "forward + backward" if backward else "forward"
    return f"### Model scale under FakeTensorMode, {title} (batch 1, seq {{seq}})\n\n" + "\n".join(rows) + "\n"


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
                        help="tiny preset only, 2 rounds, fewer calls: a few minutes")
    parser.add_argument("--scenarios", nargs="+", choices=ALL_SCENARIOS, default=None)
    parser.add_argument("--presets", nargs="+", choices=ALL_PRESETS, default=None)
    parser.add_argument("--repeats", type=int, default=None,
                        help="processes per cell and side, alternating stock and patched (default 3, quick 2)")
    parser.add_argument("--big-repeats", type=int, default=1, help="rounds for the 7B and 70B presets (default 1)")
    parser.add_argument("--steady", type=int, default=None, help="steady-state calls per fake-mode process")
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
    if args.repeats is None:
        args.repeats = 2 if args.quick else 3
    if args.steady is None:
        args.steady = 3 if args.quick else 5
    if args.calls is None:
        args.calls = 300 if args.quick else 2000
    if args.callgrind_calls is None:
        args.callgrind_calls = 1000
    args.fake_repeats = lambda p: args.repeats if p == "tiny" else args.big_repeats
    args.preset_timeout = lambda p: args.timeout if p == "tiny" else args.big_timeout
    return args


def count_workers(args) -> int:
    n = 0
    for s in args.scenarios:
        if s.startswith("fake-"):
            n += sum(args.fake_repeats(p) for p in args.presets) * len(FAKE_COLUMNS)
        elif s == "cache-hit":
            n += args.repeats * len(CACHE_HIT_VARIANTS) * 2
        elif s == "callgrind":
            n += 2
        elif s == "compile-real":
            n += args.repeats * 2
    return n


def make_report(args, pythons: dict, info: dict, sections: list[str], durations: list) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = [
        "# Benchmark results",
        "",
        f"- Date: {now}",
        f"- Command: `python benchmarks/run.py {shlex.join(args.argv)}`",
        f"- Machine: {machine()}",
    ]
    for side in ("stock", "patched"):
        i = info[side]
        desc = (f"torch {i.get('torch')}, Python {i.get('python')}, patch present: {i.get('patch')}, "
                f"newest torch .py file modified {i.get('newest')}" if "error" not in i else i["error"])
        header.append(f"- {side}: `{pythons[side]}`: {desc}")
    after = info["patched"].get("newest_after", {})
    if any(v != info["patched"].get("newest") for v in after.values()):
        header.append("- The patched tree changed during the run; newest torch .py file after each scenario: "
                      + ", ".join(f"{s} {v}" for s, v in after.items()))
    header.append("- Scenario wall times: " + ", ".join(f"{s} {d:.0f} s" for s, d in durations))
    pending = [s for s in args.scenarios if s not in {d[0] for d in durations}]
    if pending:
        header.append("- Not finished yet: " + ", ".join(pending))
    header += ["", "Times are medians over processes [min–max]; 'first' is the first call (compile included), "
               "'steady' the median of the later calls in that process. Targets are issue 4's, shown as "
               "information. See benchmarks/README.md for what each column measures.", ""]
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
    runner = Runner(pythons=pythons, log_dir=log_dir, timeout=args.timeout, total=count_workers(args))
    sections, durations, raw = [], [], {}
    fmt = {"seq": args.seq, "calls": args.calls, "cg_backend": args.callgrind_backend,
           "cg_calls": args.callgrind_calls}
    for scenario in args.scenarios:
        log(f"=== {scenario}")
        t0 = time.perf_counter()
        if scenario == "fake-fwd":
            data = run_fake(runner, args, backward=False)
            sections.append(table_fake(data, backward=False).format(**fmt))
        elif scenario == "fake-fwdbwd":
            data = run_fake(runner, args, backward=True)
            sections.append(table_fake(data, backward=True).format(**fmt))
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
