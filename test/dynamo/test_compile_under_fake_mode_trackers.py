# Owner(s): ["module: dynamo"]
"""
Trackers PyTorch ships (FlopCounterMode, MemTracker, CommDebugMode) around
compiled code called under a user-created FakeTensorMode: a frame called
under a tracker runs eagerly, as on stock, so the tracker reports eager's
figures with every module attributed; fullgraph=True does not fail for it. A
graph compiled before the tracker was entered runs op by op under it. Frames
under a dispatch mode that changes what ops return stay skipped, as on stock.
test_compile_under_fake_mode_memory_estimation.py runs torchtitan's memory
estimator through this path.
See Note [Inheriting the ambient FakeTensorMode] in
torch/_dynamo/ambient_fake_mode.py
"""

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode


try:
    from .test_compile_under_fake_mode import (
        BACKENDS,
        CompileUnderFakeModeTestCase,
        meta_of,
    )
except ImportError:
    from test_compile_under_fake_mode import (
        BACKENDS,
        CompileUnderFakeModeTestCase,
        meta_of,
    )


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.act = torch.nn.GELU()
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.down(self.act(self.up(x))) + x


def compiled(form, model, backend, fullgraph):
    """The compiled forms users write."""
    if form == "torch.compile(module)":
        return torch.compile(model, backend=backend, fullgraph=fullgraph)
    if form == "Module.compile()":
        model.compile(backend=backend, fullgraph=fullgraph)
        return model
    # torch.compile(fn) calling the module
    return torch.compile(lambda x: model(x), backend=backend, fullgraph=fullgraph)


def tracked(tracker, model, step):
    """What a tracker reports for one forward+backward step: FLOPs per module
    and op; MemTracker's peak per module; CommDebugMode's counts."""
    if tracker == "FlopCounterMode":
        with FlopCounterMode(display=False) as counter:
            step()
        return {
            mod: {str(op): n for op, n in ops.items()}
            for mod, ops in counter.get_flop_counts().items()
        }
    if tracker == "MemTracker":
        from torch.distributed._tools.mem_tracker import MemTracker

        mem_tracker = MemTracker()
        mem_tracker.track_external(model)
        with mem_tracker:
            step()
        return {
            stats.mod_fqn: {
                str(device): nbytes for device, nbytes in stats.local_peak.items()
            }
            for stats in mem_tracker.memory_tracking.values()
        }
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as comm:
        step()
    return {"comm counts": dict(comm.get_comm_counts())}


class CompileUnderFakeModeTrackerTests(CompileUnderFakeModeTestCase):
    # Every tracker around every compiled form, first call under the tracker
    # or before it: the tracker reports what it reports for the same code run
    # with set_stance("force_eager") (eager, with the compiled form's
    # wrappers: trackers built on ModTracker skip the modules inside
    # torch.compile(module) by design), nothing fails inside Dynamo, and
    # fullgraph=True holds. (On 2.13 this needs the frame skipped under the
    # tracker to compile again once the tracker is gone.)
    @parametrize("tracker", ["FlopCounterMode", "MemTracker", "CommDebugMode"])
    @parametrize(
        "form", ["torch.compile(fn)", "torch.compile(module)", "Module.compile()"]
    )
    @parametrize("first_call", ["under the tracker", "before it"])
    def test_trackers_report_eager_figures(self, tracker, form, first_call):
        mode = FakeTensorMode()
        with mode:
            x = torch.randn(4, 16, requires_grad=True)

            def step(model, fn):
                def run():
                    # Each step starts without gradients, as the first did.
                    model.zero_grad(set_to_none=True)
                    x.grad = None
                    fn(x).sum().backward()

                return run

            eager_model = MLP()
            eager_fn = compiled(form, eager_model, "inductor", fullgraph=True)
            with torch.compiler.set_stance("force_eager"):
                expected = tracked(tracker, eager_model, step(eager_model, eager_fn))
            model = MLP()
            fn = compiled(form, model, "inductor", fullgraph=True)
            if first_call == "before it":
                fn(x).sum().backward()
            for _ in range(2):
                self.assertEqual(tracked(tracker, model, step(model, fn)), expected)
            out = fn(x)
            ref = eager_model(x)
        self.assertOwnedLikeEager(out, ref, mode)

    @parametrize("backend", BACKENDS)
    def test_flop_counter_around_compiled_module(self, backend):
        # A Hugging Face-style model: FlopCounterMode around torch.compile(module).
        with FakeTensorMode():
            model = MLP()
            x = torch.randn(4, 16)
            cnt = CompileCounterWithBackend(backend)
            fn = torch.compile(model, backend=cnt)
            with FlopCounterMode(display=False) as counter:
                fn(x).sum().backward()
            with FlopCounterMode(display=False) as eager:
                model(x).sum().backward()
        self.assertEqual(counter.get_total_flops(), eager.get_total_flops())
        # Every module is attributed, as in eager (torch.compile wraps the
        # model: its wrapper is attributed too, the model under _orig_mod).
        self.assertEqual(
            {
                m.replace("OptimizedModule._orig_mod", "MLP")
                for m in counter.get_flop_counts()
            }
            - {"OptimizedModule"},
            set(eager.get_flop_counts()),
        )

    def test_fullgraph_under_a_tracker_runs_the_frame_eagerly(self):
        cnt = CompileCounterWithBackend("eager")
        mode = FakeTensorMode()
        with mode:
            x = torch.randn(4, 4)
            with FlopCounterMode(display=False) as counter:
                out = torch.compile(
                    lambda x: (x @ x).relu(), backend=cnt, fullgraph=True
                )(x)
        self.assertEqual(cnt.frame_count, 0)
        self.assertEqual(counter.get_total_flops(), 2 * 4 * 4 * 4)
        self.assertOwnedLikeEager(out, torch.empty_like(out), mode)

    def test_tracker_without_fake_mode_is_stock(self):
        # Without a user FakeTensorMode nothing changes: the frame is skipped.
        cnt = CompileCounterWithBackend("eager")
        with FlopCounterMode(display=False):
            torch.compile(lambda x: x + 1, backend=cnt)(torch.randn(3))
        self.assertEqual(cnt.frame_count, 0)

    # Dispatch modes that change what ops return keep the frame skipped.
    def test_frames_under_a_mode_that_changes_results_stay_skipped(self):
        class HalfMatmulMode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func is torch.ops.aten.mm.default:
                    out = out.to(torch.float16)
                return out

        def fn(a, b):
            y = a @ b
            # Tracing without the mode would take the other branch.
            return y * 2 if y.dtype == torch.float16 else y + 1

        cnt = CompileCounterWithBackend("eager")
        with FakeTensorMode():
            a, b = torch.randn(4, 4), torch.randn(4, 4)
            with HalfMatmulMode():
                ref = fn(a, b)
                out = torch.compile(fn, backend=cnt)(a, b)
        self.assertEqual(cnt.frame_count, 0)
        self.assertEqual(meta_of(out), meta_of(ref))


instantiate_parametrized_tests(CompileUnderFakeModeTrackerTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
