"""Estimate training memory of a compiled model under FakeTensorMode, compile off vs on.

The flow of torchtitan's memory estimator (scripts/estimate/estimation.py):
a fake process group of 8 ranks, a Llama built on meta and materialized under
FakeTensorMode, FSDP2 per block, per-block torch.compile(fullgraph=True), two
train steps (forward, loss, backward, clip_grad_norm_, AdamW step, zero_grad)
under FSDPMemTracker. The model and flow are those of
test/dynamo/test_compile_under_fake_mode_memory_estimation.py.

Each estimate runs in a fresh process (the first estimate in a process differs
from later ones, compile or not), and the script prints the tracker's peak per
category for compile off and for each backend. The tracker only observes, so
it sees the compiled run of the blocks: compile on and off agree in every
category but the activations and temporaries (and so the total), where the
compiled forward saves less and the compiled backward frees it as it goes;
with the eager backend the compiled run is eager's.

A second table shows what compile changes: the activations the forward saves
for backward (the same Llama, per-block torch.compile, one forward, measured
with saved_tensors_hooks, which is not a dispatch mode, so the compiled
blocks run), for a fake call under FakeTensorMode and for a real compiled run
on CPU. AOTAutograd's partitioner decides what is saved, so compile on and
off differ there, and the fake call must predict the real compiled run.

    .venv/bin/python tools/estimate_memory.py [--backends eager aot_eager inductor inductor-planned]

inductor-planned is inductor with torch._dynamo.config.fake_mode_plans_inductor_buffers: the fake
call runs Inductor's wrapper (its fused kernels' buffers, reuses, in-place writes), not the unlowered
graphs; it has no saved-for-backward row (what is saved is inductor's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_DIR = os.path.join(REPO, "test", "dynamo")


PLANNED = "inductor-planned"


def estimate(backend: str | None) -> dict:
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if backend == PLANNED:
        torch._dynamo.config.fake_mode_plans_inductor_buffers = True
        backend = "inductor"

    sys.path.insert(0, TEST_DIR)
    from test_compile_under_fake_mode_memory_estimation import estimate_memory, WORLD_SIZE

    dist.init_process_group("fake", rank=0, world_size=WORLD_SIZE, store=FakeStore())
    try:
        peak, _ = estimate_memory(backend)
    finally:
        dist.destroy_process_group()
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    return {"peak": peak["cpu"], "frames": frames, "torch": torch.__version__}


def saved_for_backward(backend: str | None, fake: bool) -> dict:
    """What one forward of the estimator's Llama saves for backward: count and bytes."""
    import contextlib

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    sys.path.insert(0, TEST_DIR)
    from test_compile_under_fake_mode_memory_estimation import apply_compile, Transformer

    torch.manual_seed(0)
    model = Transformer()
    if backend is not None:
        apply_compile(model, backend)
    tokens = torch.randint(0, 256, (2, 16))
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    with mode:
        if fake:
            tokens = mode.from_tensor(tokens)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(tokens)
        out.float().sum().backward()
    return {"count": len(saved), "bytes": sum(saved), "torch": torch.__version__}


def run_one(kind: str, backend: str) -> dict | None:
    proc = subprocess.run([sys.executable, __file__, kind, backend], capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ESTIMATE ")]
    if proc.returncode or not lines:
        print(f"error: {kind} {backend} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1][len("ESTIMATE "):])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["eager", "aot_eager", "inductor", PLANNED],
                        choices=["eager", "aot_eager", "inductor", PLANNED])
    # internal: run one estimate, print JSON
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--saved-fake", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--saved-real", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for kind, value in (("one", args.one), ("saved_fake", args.saved_fake), ("saved_real", args.saved_real)):
        if value is not None:
            backend = None if value == "off" else value
            result = estimate(backend) if kind == "one" else saved_for_backward(backend, kind == "saved_fake")
            print("ESTIMATE " + json.dumps(result))
            return 0
    rows = {}
    for backend in ["off", *args.backends]:
        print(f"==> estimating with compile {'off' if backend == 'off' else backend}", flush=True)
        if (row := run_one("--one", backend)) is None:
            return 1
        rows[backend] = row
    kinds = list(rows["off"]["peak"])
    print(f"\nPeak memory per category, bytes (torch {rows['off']['torch']}, FSDPMemTracker, rank 0 of 8)\n")
    print("| compile | " + " | ".join(k.replace("_FSDPRefType.", "") for k in kinds) + " | frames compiled |")
    print("|---" * (len(kinds) + 2) + "|")
    for backend, row in rows.items():
        print(f"| {backend} | " + " | ".join(f"{row['peak'][k]:,}" for k in kinds) + f" | {row['frames']} |")
    changed = {"_FSDPRefType.ACT", "_FSDPRefType.TEMP", "Total"}

    def unchanged(peak):
        return {kind: n for kind, n in peak.items() if kind not in changed}

    same = all(unchanged(row["peak"]) == unchanged(rows["off"]["peak"]) for row in rows.values())
    same &= "eager" not in rows or rows["eager"]["peak"] == rows["off"]["peak"]
    print(f"\n{'as expected' if same else 'UNEXPECTED'}: every category but activations and temporaries"
          " is compile off's; the eager backend's estimate is compile off's")

    saved = {}
    for backend in ["off", *(b for b in args.backends if b != PLANNED)]:
        print(f"==> saved for backward, compile {backend}: fake call, then a real run on CPU", flush=True)
        fake, real = run_one("--saved-fake", backend), run_one("--saved-real", backend)
        if fake is None or real is None:
            return 1
        saved[backend] = (fake, real)
    print("\nSaved for backward by one forward (saved_tensors_hooks; count, bytes)\n")
    print("| compile | fake call | real run on CPU | fake predicts real |")
    print("|---|---|---|---|")
    predicted = True
    for backend, (fake, real) in saved.items():
        match = (fake["count"], fake["bytes"]) == (real["count"], real["bytes"])
        predicted &= match
        print(f"| {backend} | {fake['count']}, {fake['bytes']:,} | {real['count']}, {real['bytes']:,} | "
              f"{'yes' if match else 'NO'} |")
    print("\nCompile changes what is saved where AOTAutograd's partitioner saves other tensors than eager"
          " (inductor's min-cut recomputes cheap ops in backward).")
    return 0 if same and predicted else 1


if __name__ == "__main__":
    sys.exit(main())
