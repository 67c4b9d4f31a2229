# Owner(s): ["module: dynamo"]
"""
Frames called under a user-created FakeTensorMode with an observer on top (a
tracker mode such as FlopCounterMode, MemTracker or CommDebugMode) are compiled;
frames under a dispatch mode that changes what ops return stay skipped.
test_compile_under_fake_mode_memory_estimation.py runs torchtitan's memory
estimator through this path.
See Note [Inheriting the ambient FakeTensorMode] in
torch/_dynamo/ambient_fake_mode.py
"""

import functools
import unittest

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
        CompileUnderFakeModeTestCase,
        HAS_IS_IN_OPTIMIZED_MODULE,
        meta_of,
    )
except ImportError:
    from test_compile_under_fake_mode import (
        CompileUnderFakeModeTestCase,
        HAS_IS_IN_OPTIMIZED_MODULE,
        meta_of,
    )


class CompileUnderFakeModeObserverTests(CompileUnderFakeModeTestCase):
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

    @unittest.skipUnless(
        HAS_IS_IN_OPTIMIZED_MODULE,
        "trackers' module hooks skip compiled modules since torch 2.10",
    )
    @parametrize("observer", ["FlopCounterMode", "MemTracker", "CommDebugMode"])
    def test_frames_compile_under_observer_modes(self, observer):
        # Observers PyTorch ships, entered as users enter them.
        if observer == "FlopCounterMode":
            make_mode = functools.partial(FlopCounterMode, display=False)
        elif observer == "MemTracker":
            from torch.distributed._tools.mem_tracker import MemTracker as make_mode
        else:
            from torch.distributed.tensor.debug import CommDebugMode as make_mode

        cnt = CompileCounterWithBackend("eager")
        mode = FakeTensorMode()
        with mode:
            x = torch.randn(4, 4)
            with make_mode():
                out = torch.compile(
                    lambda x: (x @ x).relu(), backend=cnt, fullgraph=True
                )(x)
        self.assertEqual(cnt.frame_count, 1)
        self.assertOwnedLikeEager(out, torch.empty_like(out), mode)


instantiate_parametrized_tests(CompileUnderFakeModeObserverTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
