"""Issue 30's table: a step's peak memory, a real compiled run against a fake call, on CPU or a GPU.

Each case's step runs once (it compiles, AdamW makes its state), then once more, measured:

  real   on CPU, the CPU allocator's live bytes above the step's start, from its allocation and
         free events under torch.profiler (profile_memory=True), in time order; on a GPU
         (--device cuda), torch.cuda.max_memory_allocated() above memory_allocated() at the start
  fake   the same step under a FakeTensorMode, on FakeTensors of the same device: MemTracker's
         total above what it tracks at the start (the model's parameters and gradients, the
         optimizer's state)

Columns: eager, aot_eager (real, fake), inductor (real; fake with Inductor's graphs unlowered,
the default; fake with torch._dynamo.config.fake_mode_plans_inductor_buffers, Inductor's wrapper
run without kernels). Each ratio is fake / real of its backend. A benchmark prints figures; it
never passes or fails. Run it on a quiet machine, with the patched torch:

    python benchmarks/inductor_memory.py                 # every case, the issue's sizes
    python benchmarks/inductor_memory.py --cases mlp_no_grad --scale 0.25   # a smoke run
    python benchmarks/inductor_memory.py --report        # and each planned graph's peak, buffers
    python benchmarks/inductor_memory.py --device cuda --cases mlp_no_grad mlp_backward \
        blocks_backward adamw llama_1b_adamw             # the GPU check: planned within 2%?

--report prints, after the table, what planned_peaks() (torch/_inductor/
fake_mode_wrapper_instrumentation.py) reports for each case's planned fake step: per compiled
graph, the peak of Inductor's buffers, the buffers alive at it and the modules whose ops made them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "test", "dynamo")]

from models import Block, build, Config, rotary_tables  # noqa: E402
from test_compile_under_fake_mode_inductor_buffers import MLP, fake_peak, real_peak  # noqa: E402


class Blocks(nn.Module):
    """Llama-style blocks (RMSNorm, rotary attention, SwiGLU), one after the other."""

    def __init__(self, cfg: Config, seq: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        cos, sin = rotary_tables(cfg.dim // cfg.n_heads, seq)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, (self.rope_cos, self.rope_sin))
        return x


def scaled(n: int, scale: float) -> int:
    return max(8, int(n * scale))


def mlp_case(scale: float, backward: bool):
    def make(compile):
        model = MLP(256, 1024)
        x = torch.randn(scaled(4096, scale), 256)
        fn = compile(model)
        if backward:
            return (lambda: fn(x).sum().backward()), (model,)

        def step():
            with torch.no_grad():
                fn(x)

        return step, (model,)

    return make


def blocks_case(scale: float):
    def make(compile):
        seq = scaled(512, scale)
        cfg = Config(n_layers=2, dim=256, n_heads=4, n_kv_heads=4, ffn_dim=688, vocab=1)
        model = Blocks(cfg, seq)
        x = torch.randn(8, seq, 256)
        fn = compile(model)
        return (lambda: fn(x).sum().backward()), (model,)

    return make


def adamw_case(scale: float):
    def make(compile):
        model = MLP(256, scaled(1024, scale))
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        step = compile(opt.step)
        return step, (model, opt)

    return make


def llama_1b_case(scale: float):
    def make(compile):
        model, tokens = build("1B", seq=scaled(2048, scale), batch=1)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        fn = compile(model)
        opt_step = compile(opt.step)

        def step():
            fn(tokens).float().pow(2).mean().backward()
            opt_step()
            opt.zero_grad(set_to_none=True)

        return step, (model, opt)

    return make


CASES = {
    "mlp_no_grad": ("MLP forward, no_grad (4096x256, hidden 1024)", lambda s: mlp_case(s, False)),
    "mlp_backward": ("same MLP, forward + backward", lambda s: mlp_case(s, True)),
    "blocks_backward": ("two Llama-style blocks, forward + backward (8x512x256)", blocks_case),
    "adamw": ("compiled AdamW step (gradients present)", adamw_case),
    # GPU only: 1.1 B parameters, 17.6 GB with AdamW's state in float32.
    "llama_1b_adamw": ("1B Llama-style model, forward + backward + AdamW (1x2048)", llama_1b_case),
}

# (column, backend or None for eager, fake, plans Inductor's buffers)
COLUMNS = [
    ("eager", None, False, False),
    ("real aot_eager", "aot_eager", False, False),
    ("fake aot_eager", "aot_eager", True, False),
    ("real inductor", "inductor", False, False),
    ("fake inductor, unlowered", "inductor", True, False),
    ("fake inductor, planned", "inductor", True, True),
]


def real_cuda_peak(step) -> int:
    """The peak, above what was allocated before, of the CUDA caching allocator's allocated
    bytes while step() runs."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def measure(make, backend: str | None, fake: bool, plans: bool, device: str) -> tuple[int, float, str]:
    """The measured step's peak, the first call's seconds, and (planned) its graphs' peaks."""
    torch._dynamo.reset()
    compile = (lambda fn: fn) if backend is None else (lambda fn: torch.compile(fn, backend=backend))
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch._dynamo.config.patch(fake_mode_plans_inductor_buffers=plans))
        if fake:
            stack.enter_context(FakeTensorMode())
        if device != "cpu":
            stack.enter_context(torch.device(device))
        torch.manual_seed(0)
        step, tracked = make(compile)
        start = time.perf_counter()
        step()
        first = time.perf_counter() - start
        if not fake:
            return (real_cuda_peak(step) if device == "cuda" else real_peak(step)), first, ""
        from torch._inductor.fake_mode_wrapper_instrumentation import planned_peaks

        with planned_peaks() as peaks:
            peak = fake_peak(step, *tracked)
        return peak, first, str(peaks)


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n else "0 B"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=[c for c in CASES if c != "llama_1b_adamw"])
    parser.add_argument("--scale", type=float, default=1.0, help="scale the batch (or hidden) sizes")
    parser.add_argument("--report", action="store_true", help="print each planned graph's peak and buffers")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the real runs run")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a GPU: a real compiled run is the reference")
    if args.device == "cpu" and "llama_1b_adamw" in args.cases:
        parser.error("llama_1b_adamw is a GPU case (--device cuda): 17.6 GB of state in float32")
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"torch {torch.__version__}, {where}, scale {args.scale}")
    print("| case | " + " | ".join(c[0] for c in COLUMNS) + " | first call: real inductor / planned |")
    print("|---" * (len(COLUMNS) + 2) + "|")
    reports, verdicts = {}, {}
    for name in args.cases:
        label, case = CASES[name]
        make = case(args.scale)
        figures, firsts = {}, {}
        for column, backend, fake, plans in COLUMNS:
            print(f"  {name}: {column} ...", file=sys.stderr, flush=True)
            figures[column], firsts[column], report = measure(make, backend, fake, plans, args.device)
            if plans:
                reports[label] = report
        cells = []
        for column, backend, fake, _ in COLUMNS:
            cell = mb(figures[column])
            real = figures.get(f"real {backend}")
            if fake and real is not None:
                cell += f" ({figures[column] / real:.2f}x)" if real else (" (exact)" if not figures[column] else "")
            cells.append(cell)
        cost = f"{firsts['real inductor']:.2f} s / {firsts['fake inductor, planned']:.2f} s"
        print(f"| {label} | " + " | ".join(cells) + f" | {cost} |", flush=True)
        real, planned = figures["real inductor"], figures["fake inductor, planned"]
        verdicts[label] = abs(planned - real) <= 0.02 * real if real else planned == real
    for label, within in verdicts.items():
        print(f"{label}: fake inductor, planned {'within' if within else 'NOT within'} 2% of the real run")
    for label, report in reports.items() if args.report else ():
        print(f"\n{label}, fake inductor, planned: each graph's planned peak\n{report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
