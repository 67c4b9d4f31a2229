"""The reported scenario, stock vs patched torch, as a table.

``x * 2 + 1`` compiled with ``torch.compile`` and called inside
``with FakeTensorMode():`` on an input created in that mode, on ``cpu`` and
on a fake ``cuda`` tensor, with backends eager / aot_eager / inductor.
Every case runs in its own subprocess of the given interpreter, so a crash
(stock inductor segfaults on cpu) is reported as such instead of killing the
demo.  This script does not import torch itself.

    python tools/demo.py --stock .venv-stock/bin/python --patched .venv/bin/python
"""

from __future__ import annotations

import argparse
import concurrent.futures
import signal
import subprocess
import sys
import time

CASE = r"""
import sys
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

device, backend = sys.argv[1], sys.argv[2]
f = torch.compile(lambda x: x * 2 + 1, backend=backend)
with FakeTensorMode() as mode:
    x = torch.empty(4, device=device)
    y = f(x)
if isinstance(y, FakeTensor) and y.fake_mode is mode:
    print("RESULT ok: FakeTensor of the mode")
elif isinstance(y, FakeTensor):
    print("RESULT FakeTensor of another mode")
else:
    print("RESULT real tensor")
"""

DEVICES = ["cpu", "cuda"]
BACKENDS = ["eager", "aot_eager", "inductor"]


def run_case(python: str, device: str, backend: str, timeout: float) -> str:
    try:
        cp = subprocess.run([python, "-c", CASE, device, backend], capture_output=True, text=True,
                            timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timeout (> {timeout:.0f}s)"
    if cp.returncode < 0:
        name = signal.Signals(-cp.returncode).name
        return f"segfault ({name})" if name == "SIGSEGV" else f"killed ({name})"
    for line in cp.stdout.splitlines():
        if line.startswith("RESULT "):
            return line[len("RESULT "):]
    # error: the exception line of the traceback, first line of its message
    lines = [l for l in cp.stderr.splitlines() if l.strip()]
    exc = next((l for l in reversed(lines) if not l.startswith(" ") and ":" in l
                and not l.startswith(("Traceback", "During handling", "The above", "Set TORCH"))),
               lines[-1] if lines else f"exit status {cp.returncode}")
    name, _, rest = exc.partition(":")
    exc = name.rsplit(".", 1)[-1] + ":" + rest  # torch._inductor.exc.InductorError -> InductorError
    return "error: " + (exc if len(exc) <= 72 else exc[:69] + "...")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stock", required=True, help="interpreter with stock torch")
    p.add_argument("--patched", required=True, help="interpreter with the patched torch")
    p.add_argument("--jobs", type=int, default=2, help="cases run in parallel (default 2)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per case (default 300)")
    a = p.parse_args(argv)
    cases = [(d, b) for d in DEVICES for b in BACKENDS]
    pythons = {"stock": a.stock, "patched": a.patched}
    print(f"==> running {len(cases) * 2} cases ({a.jobs} at a time); each imports torch", flush=True)
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as ex:
        futs = {(k, d, b): ex.submit(run_case, py, d, b, a.timeout)
                for k, py in pythons.items() for d, b in cases}
        results = {key: f.result() for key, f in futs.items()}
    print(f"    {time.monotonic() - t0:.0f}s\n")
    print("x * 2 + 1 under `with FakeTensorMode():`, compiled with torch.compile\n")
    w = max(len(r) for r in results.values())
    header = f"{'device':<7} {'backend':<10} {'stock':<{w}}  patched"
    print(header)
    print("-" * (len(header) + 8))
    for d, b in cases:
        print(f"{d:<7} {b:<10} {results[('stock', d, b)]:<{w}}  {results[('patched', d, b)]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
