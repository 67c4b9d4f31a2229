# Owner(s): ["module: dynamo"]
"""
Differential property tests for torch.compile under a user FakeTensorMode.

Random small programs (elementwise, reductions, matmul, views, reshape/cat,
in-place, factories) on random shapes and dtypes:
- compiled under a fake mode, the outputs have the metadata the compiled run
  gives on real tensors and are owned by the mode;
- compiled on real tensors, the values equal eager's.

Profiles (HYPOTHESIS_PROFILE): "ci" (default, small and deterministic) and
"long" (on demand: HYPOTHESIS_PROFILE=long).
See Note [Inheriting the ambient FakeTensorMode] in
torch/_dynamo/ambient_fake_mode.py
"""

import os

import torch
import torch._dynamo.test_case
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)

from hypothesis import given, HealthCheck, settings, strategies as st


settings.register_profile(
    "ci",
    max_examples=12,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
settings.register_profile(
    "long",
    max_examples=300,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# Each step maps a (rows, cols) tensor to a tensor; every step keeps a 2-d
# result so steps compose into programs.
STEPS = {
    "add": lambda x: x + 1,
    "mul_sin": lambda x: x * x.sin(),
    "where": lambda x: torch.where(x > 0, x, x * 0.5),
    "sum_keepdim": lambda x: x.sum(-1, keepdim=True) + x,
    "amax": lambda x: x - x.amax(0, keepdim=True),
    "matmul": lambda x: x @ x.t(),
    "transpose": lambda x: x.t(),
    "slice": lambda x: x[:, : max(1, x.shape[1] // 2)],
    "reshape": lambda x: x.reshape(x.shape[1], x.shape[0]),
    "cat": lambda x: torch.cat([x, x * 2], dim=0),
    "inplace": lambda x: x.clone().mul_(3).add_(x),
    "factory": lambda x: x + torch.ones(x.shape, dtype=x.dtype, device=x.device),
    "expand": lambda x: x[:, :1].expand(x.shape[0], 4) * 1,
    "to_half": lambda x: x.to(torch.float16).to(x.dtype),
}

programs = st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=4)
shapes = st.tuples(st.integers(1, 6), st.integers(1, 6))
dtypes = st.sampled_from([torch.float32, torch.float64, torch.bfloat16])


def make_fn(steps):
    def fn(x):
        outs = []
        for name in steps:
            x = STEPS[name](x)
            outs.append(x)
        return outs

    fn.__name__ = "prog_" + "_".join(steps)
    return fn


def meta_of(t):
    return (t.shape, t.stride(), t.storage_offset(), t.dtype, t.device, t.requires_grad,
            t._is_view(), t.untyped_storage().nbytes())


class CompileUnderFakeModePropertyTests(torch._dynamo.test_case.TestCase):
    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_fake_metadata_matches_the_compiled_run(self, backend):
        # Each inductor example is a real Inductor compile: keep their number small.
        examples = settings.default.max_examples
        if backend == "inductor":
            examples = max(1, examples // 3)

        @settings(max_examples=examples)
        @given(steps=programs, shape=shapes, dtype=dtypes, requires_grad=st.booleans())
        def check(steps, shape, dtype, requires_grad):
            torch._dynamo.reset()
            fn = make_fn(steps)
            mode = FakeTensorMode()
            compiled = torch.compile(fn, backend=backend)
            # The compiled run on real tensors: eager's metadata, but where
            # AOTAutograd returns fresh tensors or Inductor picks strides.
            ref = compiled(torch.randn(shape, dtype=dtype, requires_grad=requires_grad))
            # Call 1 runs the backend's graphs; calls 2 and 3 replay a region
            # where one can be built (regions are opt-in).
            with mode, torch._dynamo.config.patch(fake_mode_region_after_calls=1):
                x = torch.randn(shape, dtype=dtype, requires_grad=requires_grad)
                for _ in range(3):
                    out = compiled(x)
                    self.assertEqual(len(out), len(ref))
                    for o, r in zip(out, ref):
                        self.assertIsInstance(o, FakeTensor)
                        self.assertIs(o.fake_mode, mode)
                        self.assertEqual(meta_of(o), meta_of(r))

        check()

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_real_values_match_eager(self, backend):
        # Each example is a real Inductor compile: keep their number small.
        examples = settings.default.max_examples
        if backend == "inductor":
            examples = max(1, examples // 3)

        @settings(max_examples=examples)
        @given(steps=programs, shape=shapes)
        def check(steps, shape):
            torch._dynamo.reset()
            fn = make_fn(steps)
            x = torch.randn(shape, dtype=torch.float64)
            ref = fn(x)
            out = torch.compile(fn, backend=backend)(x)
            for o, r in zip(out, ref):
                self.assertNotIsInstance(o, FakeTensor)
                self.assertEqual(o, r, atol=1e-3, rtol=1e-3)

        check()


instantiate_parametrized_tests(CompileUnderFakeModePropertyTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
