"""One measurement in a fresh process: one scenario on the interpreter that runs this file.

``benchmarks/run.py`` starts this script once per measurement so that ``import torch``, peak RSS, Dynamo's and
inductor's caches are all per process. The result is one JSON object on the last line of stdout, prefixed with
``BENCH_JSON``. Run it by hand to look at a single number, e.g.::

    python benchmarks/worker.py fake --preset tiny --mode eager --repeats 5
    python benchmarks/worker.py fake --preset tiny --mode compile --backend aot_eager --backward
    python benchmarks/worker.py estimate --preset tiny --mode compile --backend eager
    python benchmarks/worker.py cache-hit --variant linear --calls 2000
    python benchmarks/worker.py compile-real --seq 128

Scenarios:
  fake          build a preset under a FakeTensorMode and call it (forward under torch.no_grad(), or
                forward+backward with --backward):
                --mode eager (no compile), compile (torch.compile(model), --backend eager | aot_eager | inductor
                | anchor | custom, default inductor; anchor is Inductor's graph pipeline without lowering: compile_fx
                with an inner compile that returns the graph, issue 18's yardstick; custom a user's backend that
                returns gm.forward), or compile-wrap (compile with
                torch._inductor.config.wrap_inductor_compiled_regions = True). The process makes after_calls + 1 +
                --repeats calls (after_calls: torch._dynamo.config.fake_mode_region_after_calls, or --after-calls)
                and reports every call's time, the RSS after each call, and on a patched torch the call that built
                the fake-mode regions (counters["fake_mode"]["regions_compiled"] watched after each call).
  estimate      a torchtitan-style two-step estimate under a FakeTensorMode: two steps of forward, cross-entropy
                loss, backward, AdamW(foreach=True) step and zero_grad; the model is called as is (--mode eager) or
                through torch.compile(model, backend=--backend) (--mode compile); the optimizer is eager.
  cache-hit     per-call cost of a compiled function on real tensors after warm-up (--variant one|eight|linear|
                none (no tensor input)|mode (one input, under a dispatch mode that ignores compile internals)).
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
import types

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


# The calls made before the "build call" slot where a torch builds no regions (stock, or the patch's default None).
DEFAULT_AFTER_CALLS = 16


def _after_calls(torch, args: argparse.Namespace) -> dict:
    """Set and report after_calls: the op-by-op calls before a patched torch builds the regions.

    On a patched torch, torch._dynamo.config.fake_mode_region_after_calls (its default, or --after-calls, which sets
    it); on a torch without it (stock) only the number of calls the process makes, so both sides call alike.
    """
    cfg = torch._dynamo.config
    has_switch = hasattr(cfg, "fake_mode_region_after_calls")
    default = getattr(cfg, "fake_mode_region_after_calls", None)  # the patch's default is None: regions are opt-in
    if args.after_calls is not None:
        used, source = args.after_calls, "--after-calls"
        if has_switch:
            cfg.fake_mode_region_after_calls = args.after_calls
    elif default is not None:
        used, source = default, "config default"
    else:
        used, source = DEFAULT_AFTER_CALLS, "regions off (no switch in this torch, or None); call count only"
    return {"after_calls": used, "after_calls_source": source, "after_calls_default": default}


def _regions_compiled(torch) -> int:
    from torch._dynamo.utils import counters

    # A stock torch never counts any: the counter is the patch's.
    return int(counters["fake_mode"].get("regions_compiled", 0))


def _stock_inductor_skip(args: argparse.Namespace, info: dict) -> dict | None:
    if args.mode == "compile" and args.backend == "inductor" and not info["patch_present"] and not args.force:
        # Stock inductor kernels read the fakes' (absent) data and crash the process; say so instead.
        return {"status": "skipped",
                "reason": "stock torch: inductor under FakeTensorMode segfaults (use --force to see)"}
    return None


def _anchor_backend(gm, example_inputs):
    """Inductor's graph pipeline (decompositions, joint passes, partitioner) without lowering."""
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.compile_fx import compile_fx

    def inner_compile(graph, inputs, **kwargs):
        return make_boxed_func(graph.forward)

    return compile_fx(gm, example_inputs, inner_compile=inner_compile)


def _custom_backend(gm, example_inputs):
    """A user's own backend: runs the graph Dynamo captured, as many custom backends do."""
    return gm.forward


BACKENDS = {"anchor": _anchor_backend, "custom": _custom_backend}


def run_fake(args: argparse.Namespace) -> dict:
    torch, info = _import_torch()
    from torch._subclasses.fake_tensor import FakeTensorMode

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import models

    torch.manual_seed(0)
    result = dict(info)
    result["backend"] = None if args.mode == "eager" else args.backend
    skip = _stock_inductor_skip(args, info)
    if skip:
        result.update(skip)
        return result
    if args.mode == "compile-wrap":
        torch._inductor.config.wrap_inductor_compiled_regions = True
    if args.op_by_op:
        torch._dynamo.config.fake_mode_runs_backend_graphs = False
    result.update(_after_calls(torch, args))
    after_calls = result["after_calls"]
    # Calls 0 .. after_calls - 1 run op by op (call 0 compiles), call after_calls builds the regions on a patched
    # torch, then --repeats steady-state calls. Every mode makes the same calls, so the columns line up.
    n_calls = after_calls + 1 + args.repeats
    if args.count_calls:
        n_calls = args.count_call_index + 1
    if args.no_record:
        # What the replay's record costs: the same calls with the record a no-op (nothing is replayed then).
        from torch._dynamo import fake_mode_replay

        fake_mode_replay.Replay.record = lambda self, *args, **kwargs: None

    dtype = getattr(torch, args.dtype)
    with FakeTensorMode():
        t0 = time.perf_counter()
        model, tokens = models.build(args.preset, seq=args.seq, dtype=dtype)
        result["build_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        backend = BACKENDS.get(args.backend, args.backend)
        fn = model if args.mode == "eager" else torch.compile(model, backend=backend)
        # torch.compile() itself (lazy imports, no tracing yet); not part of any call's time.
        result["compile_call_s"] = time.perf_counter() - t0

        def step():
            out = fn(tokens)
            if args.backward:
                out.float().mean().backward()
                for p in model.parameters():
                    p.grad = None
            return out

        calls, rss, regions = [], [], []
        profiler = None
        for call in range(n_calls):
            t0 = time.perf_counter()
            # Forward alone is inference, as people estimate it: under no_grad.
            with _nullcontext() if args.backward else torch.no_grad():
                if args.count_calls and call == args.count_call_index:
                    import cProfile

                    profiler = cProfile.Profile()
                    profiler.enable()
                out = step()
                if profiler is not None and call == args.count_call_index:
                    profiler.disable()
            calls.append(time.perf_counter() - t0)
            rss.append(_rss_mb())
            regions.append(_regions_compiled(torch))
        result["out_type"] = type(out).__name__
        result["out_shape"] = list(out.shape)

    if profiler is not None:
        import pstats

        # Python and builtin function calls: the work done, whatever the machine's load.
        result["first_call_py_calls"] = pstats.Stats(profiler).total_calls
        result["counted_call"] = args.count_call_index
    result["calls_s"] = calls
    result["rss_after_call_mb"] = rss
    result["first_s"] = calls[0]
    result["rss_after_first_mb"] = rss[0]
    result["regions_compiled"] = regions[-1]
    # The calls on which the counter went up (one per compiled entry; all entries of a model count alike).
    built = [i for i, n in enumerate(regions) if n > (regions[i - 1] if i else 0)]
    result["regions_calls"] = built
    result["regions_call"] = built[0] if built else None
    # Split the calls where the regions were built, or where they would be (no regions: stock, eager, failed).
    split = built[0] if built else min(after_calls, n_calls - 1)
    result["split_call"] = split
    result["op_by_op_s"] = _summary(calls[1:split]) if split > 1 else None
    result["split_call_s"] = calls[split]
    result["steady_s"] = _summary(calls[split + 1:]) if split + 1 < n_calls else None
    result["rss_before_split_mb"] = rss[split - 1] if split else None
    if args.mode != "eager":
        result["graphs"] = _graph_count(torch)
    result["status"] = "ok"
    return result


def run_estimate(args: argparse.Namespace) -> dict:
    torch, info = _import_torch()
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import models

    torch.manual_seed(0)
    result = dict(info)
    result["backend"] = None if args.mode == "eager" else args.backend
    skip = _stock_inductor_skip(args, info)
    if skip:
        result.update(skip)
        return result
    result.update(_after_calls(torch, args))

    dtype = getattr(torch, args.dtype)
    with FakeTensorMode():
        t0 = time.perf_counter()
        model, tokens = models.build(args.preset, seq=args.seq, dtype=dtype)
        labels = torch.randint(0, models.PRESETS[args.preset].vocab, tokens.shape)
        result["build_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        backend = BACKENDS.get(args.backend, args.backend)
        fn = model if args.mode == "eager" else torch.compile(model, backend=backend)
        # torch.compile() itself (lazy imports, no tracing yet); not part of the steps' time.
        result["compile_call_s"] = time.perf_counter() - t0
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True)

        steps, rss = [], []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            logits = fn(tokens)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            steps.append(time.perf_counter() - t0)
            rss.append(_rss_mb())
        result["loss_type"] = type(loss).__name__
        result["optimizer_state_tensors"] = sum(
            isinstance(v, torch.Tensor) for state in optimizer.state.values() for v in state.values())

    result["steps_s"] = steps
    result["total_s"] = sum(steps)
    result["rss_after_step_mb"] = rss
    result["regions_compiled"] = _regions_compiled(torch)
    if args.mode != "eager":
        result["graphs"] = _graph_count(torch)
    result["status"] = "ok"
    return result


CACHE_HIT_VARIANTS = ["one", "eight", "linear", "none", "mode", "one-filtered", "eight-filtered", "linear-filtered"]


def _compile_cache_hit_case(torch, variant: str, backend: str):
    """The compiled function of a cache-hit variant and its inputs. A -filtered variant is compiled under
    guard_filter_fn=skip_all_guards_unsafe (written out: releases before 2.8 lack it), so its entry holds no guard;
    its function (or module's forward) has a code object of its own, since Dynamo keeps compiled entries per code
    object and the unfiltered variant's entry would otherwise serve it (and a guardless entry the unfiltered one)."""
    base, _, filtered = variant.partition("-")
    fn, inputs = _cache_hit_case(torch, base)
    if not filtered:
        return torch.compile(fn, backend=backend), inputs
    if isinstance(fn, torch.nn.Module):
        cls = type(fn)
        fn.__class__ = type("Filtered" + cls.__name__, (cls,), {"forward": _own_code(cls.forward)})
    else:
        fn = _own_code(fn)
    options = {"guard_filter_fn": lambda entries: [False] * len(entries)}
    return torch.compile(fn, backend=backend, options=options), inputs


def _own_code(fn):
    """fn with a copy of its code object (another name), so Dynamo compiles it apart."""
    code = fn.__code__.replace(co_name=fn.__code__.co_name + "_filtered")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


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
    if variant == "none":
        def f():
            return torch.ones(8) * 2

        return f, ()
    if variant == "mode":
        # "one", called under a dispatch mode that lets Dynamo compile (as DebugMode does): see _calling_context.
        def f(x):
            return x.sin() + 1

        return f, (torch.randn(8),)
    raise ValueError(variant)


def _calling_context(torch, variant: str):
    """What a variant's calls run under: the "mode" variant under a TorchDispatchMode that ignores compile
    internals and passes every op through (Dynamo compiles under it; the compiled graph's ops reach it)."""
    if variant != "mode":
        return _nullcontext()
    from torch.utils._python_dispatch import TorchDispatchMode

    class PassThrough(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls):
            return True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    return PassThrough()


def run_cache_hit(args: argparse.Namespace) -> dict:
    torch, info = _import_torch()
    result = dict(info)
    compiled, inputs = _compile_cache_hit_case(torch, args.variant, args.backend)
    t0 = time.perf_counter()
    with torch.no_grad() if args.no_grad else _nullcontext(), _calling_context(torch, args.variant):
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
    # Each variant is compiled, warmed up and counted before the next one compiles: modules share
    # nn.Module's call code, and a later entry (a guard filter's, without guards) would serve earlier ones.
    for variant in args.variants:
        compiled, inputs = _compile_cache_hit_case(torch, variant, args.backend)
        with _calling_context(torch, variant):
            for _ in range(args.warmup):
                compiled(*inputs)
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
    p.add_argument("--backend", default="inductor", choices=["eager", "aot_eager", "inductor", "anchor", "custom"],
                   help="torch.compile backend for --mode compile (compile-wrap is inductor; custom: a backend "
                        "that returns gm.forward)")
    p.add_argument("--op-by-op", action="store_true",
                   help="patched torch: fake_mode_runs_backend_graphs = False (run every graph op by op)")
    p.add_argument("--backward", action="store_true", help="forward + backward of mean(logits)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--repeats", type=int, default=5,
                   help="steady-state calls after the call that builds the regions (default 5)")
    p.add_argument("--after-calls", type=int, default=None,
                   help="set torch._dynamo.config.fake_mode_region_after_calls (default: the torch's own; 16 "
                        "where it has none); the process makes after_calls + 1 + --repeats calls")
    p.add_argument("--force", action="store_true", help="run stock inductor under fake even though it crashes")
    p.add_argument("--count-calls", action="store_true",
                   help="make only the first call, under cProfile, and report its function calls "
                        "(first_call_py_calls; its time is cProfile's, not a figure)")
    p.add_argument("--count-call-index", type=int, default=0,
                   help="with --count-calls: make this many calls first and count the next one's (default 0)")
    p.add_argument("--no-record", action="store_true",
                   help="patched torch: the replay's record a no-op (to measure what recording costs)")
    p.set_defaults(func=run_fake)

    p = sub.add_parser("estimate", help="two training steps (forward, loss, backward, AdamW) under FakeTensorMode")
    p.add_argument("--preset", default="tiny", choices=["tiny", "7B", "70B"])
    p.add_argument("--mode", default="eager", choices=["eager", "compile"])
    p.add_argument("--backend", default="inductor", choices=["eager", "aot_eager", "inductor"],
                   help="torch.compile backend for --mode compile")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--after-calls", type=int, default=None,
                   help="set torch._dynamo.config.fake_mode_region_after_calls (default: the torch's own)")
    p.add_argument("--force", action="store_true", help="run stock inductor under fake even though it crashes")
    p.set_defaults(func=run_estimate)

    p = sub.add_parser("cache-hit", help="per-call cost of a compiled function on real tensors")
    p.add_argument("--variant", default="one", choices=CACHE_HIT_VARIANTS)
    p.add_argument("--backend", default="inductor")
    p.add_argument("--calls", type=int, default=1000, help="calls per timed block")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5, help="timed blocks")
    p.add_argument("--no-grad", action="store_true", help="call under torch.no_grad()")
    p.set_defaults(func=run_cache_hit)

    p = sub.add_parser("callgrind", help="cache-hit calls counted in callgrind windows (run under valgrind)")
    p.add_argument("--variants", nargs="+", default=CACHE_HIT_VARIANTS, choices=CACHE_HIT_VARIANTS)
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
    if getattr(args, "after_calls", None) is not None and args.after_calls < 1:
        parser.error("--after-calls must be at least 1")
    if args.scenario == "fake" and args.repeats < 1:
        parser.error("--repeats must be at least 1")
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
