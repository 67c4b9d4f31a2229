"""One measurement in a fresh process: one scenario on the interpreter that runs this file.

``benchmarks/run.py`` starts this script once per measurement so that ``import torch``, peak RSS, Dynamo's and
inductor's caches are all per process. The result is one JSON object on the last line of stdout, prefixed with
``BENCH_JSON``. Run it by hand to look at a single number, e.g.::

    python benchmarks/worker.py fake --preset tiny --mode eager --repeats 5
    python benchmarks/worker.py cache-hit --variant linear --calls 2000
    python benchmarks/worker.py compile-real --seq 128

Scenarios:
  fake          build a preset under a FakeTensorMode and call it (forward, or forward+backward with --backward):
                --mode eager (no compile), compile (torch.compile(model), --backend, default inductor), or
                compile-wrap (compile with torch._inductor.config.wrap_inductor_compiled_regions = True).
  cache-hit     per-call cost of a compiled function on real tensors after warm-up (--variant one|eight|linear).
  callgrind     the cache-hit variants, each counted in a callgrind window (run under valgrind, see run.py)
  compile-real  first-call compile of the tiny decoder on real tensors, with a fresh inductor cache.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

_T_START = time.perf_counter()


def _rss_mb() -> float:
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _summary(samples: list[float]) -> dict:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "n": len(samples),
    }


def _import_torch() -> tuple[object, dict]:
    t0 = time.perf_counter()
    import torch
    import torch._dynamo

    info = {
        "torch_version": torch.__version__,
        "torch_file": os.path.dirname(torch.__file__),
        "patch_present": hasattr(torch._dynamo.config, "inherit_ambient_fake_mode"),
        "import_s": time.perf_counter() - t0,
        "rss_after_import_mb": _rss_mb(),
    }
    return torch, info


def _graph_count(torch) -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def run_fake(args: argparse.Namespace) -> dict:
    torch, info = _import_torch()
    from torch._subclasses.fake_tensor import FakeTensorMode

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import models

    torch.manual_seed(0)
    result = dict(info)
    if args.mode in ("compile", "compile-wrap") and args.backend == "inductor":
        if args.mode == "compile" and not info["patch_present"] and not args.force:
            # Stock inductor kernels read the fakes' (absent) data and crash the process; say so instead.
            result["status"] = "skipped"
            result["reason"] = "stock torch: inductor under FakeTensorMode segfaults (use --force to see)"
            return result
        if args.mode == "compile-wrap":
            torch._inductor.config.wrap_inductor_compiled_regions = True

    dtype = getattr(torch, args.dtype)
    with FakeTensorMode():
        t0 = time.perf_counter()
        model, tokens = models.build(args.preset, seq=args.seq, dtype=dtype)
        result["build_s"] = time.perf_counter() - t0
        fn = model if args.mode == "eager" else torch.compile(model, backend=args.backend)

        def step():
            out = fn(tokens)
            if args.backward:
                out.float().mean().backward()
                for p in model.parameters():
                    p.grad = None
            return out

        t0 = time.perf_counter()
        out = step()
        result["first_s"] = time.perf_counter() - t0
        result["rss_after_first_mb"] = _rss_mb()
        samples = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = step()
            samples.append(time.perf_counter() - t0)
        result["steady_s"] = _summary(samples)
        result["out_type"] = type(out).__name__
        result["out_shape"] = list(out.shape)
    if args.mode != "eager":
        result["graphs"] = _graph_count(torch)
    result["status"] = "ok"
    return result


def _cache_hit_case(torch, variant: str):
    if variant == "one":
        def f(x):
            return x.sin() + 1

        return f, (torch.randn(8),)
    if variant == "eight":
        def f(a, b, c, d, e, g, h, i):
            return a + b * c - d + e * g - h + i

        return f, tuple(torch.randn(8) for _ in range(8))
    if variant == "linear":
        return torch.nn.Linear(8, 8), (torch.randn(2, 8),)
    raise ValueError(variant)


def run_cache_hit(args: argparse.Namespace) -> dict:
    torch, info = _import_torch()
    result = dict(info)
    fn, inputs = _cache_hit_case(torch, args.variant)
    compiled = torch.compile(fn, backend=args.backend)
    t0 = time.perf_counter()
    with torch.no_grad() if args.no_grad else _nullcontext():
        compiled(*inputs)
        result["first_s"] = time.perf_counter() - t0
        for _ in range(args.warmup):
            compiled(*inputs)
        blocks = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for _ in range(args.calls):
                compiled(*inputs)
            blocks.append((time.perf_counter() - t0) / args.calls)
    result["per_call_s"] = _summary(blocks)
    result["graphs"] = _graph_count(torch)
    result["status"] = "ok"
    return result


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def run_callgrind(args: argparse.Namespace) -> dict:
    """All cache-hit variants in one process, each counted in its own callgrind window.

    Run under ``valgrind --tool=callgrind --collect-atstart=no``: collection is off during import, compile and
    warm-up; torch's own valgrind hooks (as torch.utils.benchmark uses them) switch it on for exactly ``--calls``
    calls of one variant and dump the counts, so dump k (``<out>.k``) holds variant k's calls and nothing else.
    """
    torch, info = _import_torch()
    result = dict(info)
    if not torch._C._valgrind_supported_platform():
        result.update(status="skipped", reason="this torch build has no valgrind hooks")
        return result
    cases = []
    for variant in args.variants:
        fn, inputs = _cache_hit_case(torch, variant)
        compiled = torch.compile(fn, backend=args.backend)
        for _ in range(args.warmup):
            compiled(*inputs)
        cases.append((compiled, inputs))
    for compiled, inputs in cases:
        torch._C._valgrind_toggle()
        for _ in range(args.calls):
            compiled(*inputs)
        torch._C._valgrind_toggle_and_dump_stats()
    result["variants"] = args.variants
    result["graphs"] = _graph_count(torch)
    result["status"] = "ok"
    return result


def run_compile_real(args: argparse.Namespace) -> dict:
    torch, info = _import_torch()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import models

    result = dict(info)
    result["inductor_cache_dir"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    torch.manual_seed(0)
    model, tokens = models.build(args.preset, seq=args.seq)
    compiled = torch.compile(model, backend=args.backend)
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled(tokens)
        result["first_s"] = time.perf_counter() - t0
        samples = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            compiled(tokens)
            samples.append(time.perf_counter() - t0)
    result["steady_s"] = _summary(samples)
    result["graphs"] = _graph_count(torch)
    result["status"] = "ok"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="scenario", required=True)

    p = sub.add_parser("fake", help="a preset under FakeTensorMode: eager, compile, or compile-wrap")
    p.add_argument("--preset", default="tiny", choices=["tiny", "7B", "70B"])
    p.add_argument("--mode", default="eager", choices=["eager", "compile", "compile-wrap"])
    p.add_argument("--backend", default="inductor", help="torch.compile backend for the compile modes")
    p.add_argument("--backward", action="store_true", help="forward + backward of mean(logits)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--repeats", type=int, default=5, help="steady-state calls after the first")
    p.add_argument("--force", action="store_true", help="run stock inductor under fake even though it crashes")
    p.set_defaults(func=run_fake)

    p = sub.add_parser("cache-hit", help="per-call cost of a compiled function on real tensors")
    p.add_argument("--variant", default="one", choices=["one", "eight", "linear"])
    p.add_argument("--backend", default="inductor")
    p.add_argument("--calls", type=int, default=1000, help="calls per timed block")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5, help="timed blocks")
    p.add_argument("--no-grad", action="store_true", help="call under torch.no_grad()")
    p.set_defaults(func=run_cache_hit)

    p = sub.add_parser("callgrind", help="cache-hit calls counted in callgrind windows (run under valgrind)")
    p.add_argument("--variants", nargs="+", default=["one", "eight", "linear"], choices=["one", "eight", "linear"])
    p.add_argument("--backend", default="eager")
    p.add_argument("--calls", type=int, default=1000, help="calls counted per variant")
    p.add_argument("--warmup", type=int, default=200)
    p.set_defaults(func=run_callgrind)

    p = sub.add_parser("compile-real", help="first-call inductor compile of a preset on real tensors")
    p.add_argument("--preset", default="tiny", choices=["tiny"])
    p.add_argument("--backend", default="inductor")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--keep-cache", action="store_true",
                   help="use the inherited inductor cache instead of a fresh one (then it may not compile)")
    p.set_defaults(func=run_compile_real)

    args = parser.parse_args(argv)
    if args.scenario == "compile-real" and not args.keep_cache:
        # Must happen before torch is imported: inductor reads these at import / first use.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-inductor-")
        os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
    result = {"scenario": args.scenario, "args": {k: v for k, v in vars(args).items() if k != "func"}}
    result.update(args.func(args))
    result["peak_rss_mb"] = _rss_mb()
    result["process_s"] = time.perf_counter() - _T_START
    print("BENCH_JSON " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
