# Owner(s): ["module: dynamo"]
"""
Backends called for a frame compiled under a user-created FakeTensorMode: Inductor
and aot_autograd backends lower nothing for fake calls (they build the graphs of
the real run, which Dynamo runs under the mode; their compilers' artifacts would
never run), Inductor compiles on the first real call, and
compile_backend_under_fake_mode runs the backend without running its artifact.
See Note [Inheriting the ambient FakeTensorMode] in
torch/_dynamo/ambient_fake_mode.py
"""

import unittest
import unittest.mock

import torch
import torch._dynamo.test_case
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


try:
    from .test_compile_under_fake_mode import (
        BACKENDS,
        CompileUnderFakeModeTestCase,
    )
except ImportError:
    from test_compile_under_fake_mode import (
        BACKENDS,
        CompileUnderFakeModeTestCase,
    )


class CompileUnderFakeModeBackendTests(CompileUnderFakeModeTestCase):
    # Fake cuda inputs work on a machine without a GPU.
    @parametrize("backend", BACKENDS)
    def test_fake_cuda_input(self, backend):
        out = self.check_like_eager(
            lambda x: x * 2 + 1, lambda: (torch.randn(4, 3, device="cuda"),), backend
        )
        self.assertEqual(out.device.type, "cuda")

    @unittest.skipUnless(
        hasattr(torch._dynamo.decorators, "leaf_function"), "torch without leaf_function"
    )
    @parametrize("backend", ["aot_eager", "inductor"])
    def test_leaf_function(self, backend):
        # Its node's value holds a TreeSpec beside the tensors (the check for
        # data-dependent sizes looked at every value).
        from torch._dynamo.decorators import leaf_function

        @leaf_function
        def gram(x):
            return (x @ x.t(),)

        @gram.register_fake
        def _(x):
            return (x.new_empty(x.shape[0], x.shape[0]),)

        def fn(linear, x):
            y = linear(x)
            return y + gram(y)[0].sum()

        with FakeTensorMode() as mode:
            linear = torch.nn.Linear(8, 8)
            x = torch.randn(4, 8, requires_grad=True)
            out = torch.compile(fn, backend=backend)(linear, x)
            out.sum().backward()
        self.assertIs(out.fake_mode, mode)
        self.assertEqual(out.shape, (4, 8))
        self.assertEqual(x.grad.shape, (4, 8))

    def test_inductor_compiles_on_first_real_call_only(self):
        fn = torch.compile(lambda x: x.cos() + x, backend="inductor")
        with FakeTensorMode():
            fn(torch.randn(3, 3))
            fn(torch.randn(3, 3, device="cuda"))
        # No code generated that could never run.
        self.assertEqual(self.inductor_compiles, 0)
        real = torch.randn(3, 3)
        self.assertEqual(fn(real), real.cos() + real)
        self.assertEqual(self.inductor_compiles, 1)

    def test_counterfactual_inductor_kernels_run_on_fakes(self):
        # With the feature off, Inductor's kernels run on the FakeTensors.
        with torch._dynamo.config.patch(inherit_ambient_fake_mode=False):
            with FakeTensorMode():
                x = torch.randn(4)
                with self.assertRaisesRegex(RuntimeError, "data pointer"):
                    torch.compile(lambda x: x * 2 + 1, backend="inductor")(x)

    def test_compile_backend_under_fake_mode_runs_backend_not_artifact(self):
        cnt = CompileCounterWithBackend("inductor")
        mode = FakeTensorMode()
        with torch._dynamo.config.patch(compile_backend_under_fake_mode=True):
            with mode:
                out = torch.compile(lambda x: x * 2 + 1, backend=cnt)(torch.randn(4))
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(self.inductor_compiles, 1)
        self.assertIs(out.fake_mode, mode)

    def test_aot_autograd_builds_graphs_but_calls_no_compiler_for_fake_calls(self):
        # AOTAutograd traces and partitions as for the real run; its
        # compilers, whose artifacts would never run on FakeTensors, are not
        # called, unless compile_backend_under_fake_mode asks for them.
        compiled_graphs = []

        def compiler(gm, example_inputs):
            compiled_graphs.append(gm)
            return gm

        backend = aot_autograd(fw_compiler=compiler)
        fn = lambda x: x.sin() * 2  # noqa: E731
        # No region either (regions trace with AOTAutograd too).
        self._stack.enter_context(
            torch._dynamo.config.patch(fake_mode_region_after_calls=None)
        )
        with FakeTensorMode():
            torch.compile(fn, backend=backend)(torch.randn(3))
        self.assertEqual(counters["aot_autograd"]["total"], 1)
        self.assertEqual(compiled_graphs, [])
        torch._dynamo.reset()
        with torch._dynamo.config.patch(fake_mode_runs_backend_graphs=False):
            with FakeTensorMode():
                torch.compile(fn, backend=backend)(torch.randn(3))
        self.assertEqual(counters["aot_autograd"]["total"], 1)
        torch._dynamo.reset()
        with torch._dynamo.config.patch(compile_backend_under_fake_mode=True):
            with FakeTensorMode():
                torch.compile(fn, backend=backend)(torch.randn(3))
        self.assertEqual(counters["aot_autograd"]["total"], 2)
        self.assertEqual(len(compiled_graphs), 1)

    # Nothing an AOTAutograd backend builds for fake calls enters or comes
    # from AOTAutograd's caches, local or remote (review: the remote one was
    # still consulted): each backend turns them off for such a compile.
    @parametrize("backend", ["aot_eager", "inductor"])
    def test_no_aot_autograd_cache_serves_a_fake_compile(self, backend):
        from torch._dynamo import fake_mode_backend_graphs

        seen = []

        def recording(compile_unlowered):
            def compile(gm, example_inputs, **kwargs):
                config = torch._functorch.config
                seen.append(
                    (config.enable_autograd_cache, config.enable_remote_autograd_cache)
                )
                return compile_unlowered(gm, example_inputs, **kwargs)

            return compile

        for name in ("compile_unlowered", "compile_unlowered_kernels"):
            self._stack.enter_context(
                unittest.mock.patch.object(
                    fake_mode_backend_graphs,
                    name,
                    recording(getattr(fake_mode_backend_graphs, name)),
                )
            )
        self._stack.enter_context(
            torch._functorch.config.patch(
                enable_autograd_cache=True, enable_remote_autograd_cache=True
            )
        )
        with FakeTensorMode():
            torch.compile(lambda x: x.sin() * 2, backend=backend)(torch.randn(3))
        self.assertTrue(seen)
        self.assertEqual(set(seen), {(False, False)})


instantiate_parametrized_tests(CompileUnderFakeModeBackendTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
