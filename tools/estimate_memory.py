"""Estimate training memory of a compiled model under FakeTensorMode, compile off vs on.

The flow of torchtitan's memory estimator (scripts/estimate/estimation.py):
a fake process group of 8 ranks, a Llama built on meta and materialized under
FakeTensorMode, FSDP2 per block, per-block torch.compile(fullgraph=True), two
train steps (forward, loss, backward, clip_grad_norm_, AdamW step, zero_grad)
under FSDPMemTracker. The model and flow are those of
test/dynamo/test_compile_under_fake_mode_memory_estimation.py.

Each estimate runs in a fresh process (the first estimate in a process differs
from later ones, compile or not), and the script prints the tracker's peak per
category for compile off and for each backend.

    .venv/bin/python tools/estimate_memory.py [--backends eager aot_eager inductor]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_DIR = os.path.join(REPO, "test", "dynamo")


def estimate(backend: str | None) -> dict:
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    sys.path.insert(0, TEST_DIR)
    from test_compile_under_fake_mode_memory_estimation import estimate_memory, WORLD_SIZE

    dist.init_process_group("fake", rank=0, world_size=WORLD_SIZE, store=FakeStore())
    try:
        peak, _ = estimate_memory(backend)
    finally:
        dist.destroy_process_group()
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    return {"peak": peak["cpu"], "frames": frames, "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["eager", "aot_eager", "inductor"])
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one estimate, print JSON
    args = parser.parse_args(argv)
    if args.one is not None:
        print("ESTIMATE " + json.dumps(estimate(None if args.one == "off" else args.one)))
        return 0
    rows = {}
    for backend in ["off", *args.backends]:
        print(f"==> estimating with compile {'off' if backend == 'off' else backend}", flush=True)
        proc = subprocess.run([sys.executable, __file__, "--one", backend], capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ESTIMATE ")]
        if proc.returncode or not lines:
            print(f"error: the estimate with compile {backend} failed (exit {proc.returncode}):\n"
                  f"{proc.stderr[-3000:]}", file=sys.stderr)
            return 1
        rows[backend] = json.loads(lines[-1][len("ESTIMATE "):])
    kinds = list(rows["off"]["peak"])
    print(f"\nPeak memory per category, bytes (torch {rows['off']['torch']}, FSDPMemTracker, rank 0 of 8)\n")
    print("| compile | " + " | ".join(k.replace("_FSDPRefType.", "") for k in kinds) + " | frames compiled |")
    print("|---" * (len(kinds) + 2) + "|")
    for backend, row in rows.items():
        print(f"| {backend} | " + " | ".join(f"{row['peak'][k]:,}" for k in kinds) + f" | {row['frames']} |")
    same = all(row["peak"] == rows["off"]["peak"] for row in rows.values())
    print(f"\n{'the same' if same else 'DIFFERENT'} estimate with compile on as with compile off")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
