# Owner(s): ["module: dynamo"]
"""
torch.compile called under a user-created FakeTensorMode, or on FakeTensors made
by one, behaves like the same function run eagerly under that mode.
See Note [Inheriting the ambient FakeTensorMode] in torch/_dynamo/output_graph.py
"""

import contextlib
from unittest import mock

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
import torch._inductor.compile_fx
import torch.nn.functional as F
from torch._dynamo.testing import (
    CompileCounterWithBackend,
    EagerAndRecordGraphs,
    normalize_gm,
)
from torch._dynamo.utils import counters
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    FakeTensor,
    FakeTensorMode,
)
from torch.fx.experimental.symbolic_shapes import ShapeEnv, StatelessSymbolicContext
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.utils.flop_counter import FlopCounterMode


BACKENDS = ["eager", "aot_eager", "inductor"]


def meta_of(t):
    return (
        type(t),
        t.shape,
        t.stride(),
        t.storage_offset(),
        t.dtype,
        t.device,
        t.requires_grad,
    )


def frames_compiled():
    return counters["stats"]["unique_graphs"]




class CompileUnderFakeModeTests(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        # A FakeTensor's data pointer must never be read: that is what
        # Inductor's kernels would do if they ran on FakeTensors.
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(
            torch._functorch.config.patch(fake_tensor_allow_unsafe_data_ptr_access=False)
        )
        # Count the graphs Inductor compiles; no cache may skip one.
        self._stack.enter_context(
            torch._functorch.config.patch(enable_autograd_cache=False)
        )
        self._stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
        self.inductor_compiles = 0
        compile_fx = torch._inductor.compile_fx
        compile_fx_inner = compile_fx._compile_fx_inner

        def counting_compile_fx_inner(*args, **kwargs):
            self.inductor_compiles += 1
            return compile_fx_inner(*args, **kwargs)

        self._stack.enter_context(
            mock.patch.object(compile_fx, "_compile_fx_inner", counting_compile_fx_inner)
        )

    def tearDown(self):
        self._stack.close()
        super().tearDown()

    def assertOwnedLikeEager(self, out, ref, mode):
        """out (compiled under mode) matches ref (eager under mode)."""
        flat_out, spec_out = torch.utils._pytree.tree_flatten(out)
        flat_ref, spec_ref = torch.utils._pytree.tree_flatten(ref)
        self.assertEqual(spec_out, spec_ref)
        for o, r in zip(flat_out, flat_ref):
            if isinstance(r, torch.Tensor):
                self.assertIsInstance(o, FakeTensor)
                self.assertIs(o.fake_mode, mode)
                self.assertEqual(meta_of(o), meta_of(r))
            else:
                self.assertEqual(o, r)

    def check_like_eager(self, fn, make_inputs, backend, mode=None, **compile_kwargs):
        mode = mode or FakeTensorMode()
        with mode:
            inputs = make_inputs()
            ref = fn(*inputs)
            inputs = make_inputs()
            out = torch.compile(fn, backend=backend, **compile_kwargs)(*inputs)
        self.assertOwnedLikeEager(out, ref, mode)
        return out

    # 1. Outputs are FakeTensors owned by the mode, with eager's metadata.
    @parametrize("backend", BACKENDS)
    def test_outputs_owned_by_mode(self, backend):
        self.check_like_eager(lambda x: x * 2 + 1, lambda: (torch.randn(4, 3),), backend)

    @parametrize("backend", BACKENDS)
    def test_noncontiguous_and_dtype(self, backend):
        def fn(x, y):
            return x.t() @ y, (x.t() + 1).to(torch.float16), x.sum(0, keepdim=True)

        self.check_like_eager(
            fn, lambda: (torch.randn(5, 3), torch.randn(5, 2)), backend
        )

    # 2. Fake cuda inputs work on a machine without a GPU.
    @parametrize("backend", BACKENDS)
    def test_fake_cuda_input(self, backend):
        out = self.check_like_eager(
            lambda x: x * 2 + 1, lambda: (torch.randn(4, 3, device="cuda"),), backend
        )
        self.assertEqual(out.device.type, "cuda")

    # 3. Inputs used outside the mode, from_tensor, no tensor inputs at all.
    @parametrize("backend", BACKENDS)
    def test_fake_inputs_called_outside_mode(self, backend):
        mode = FakeTensorMode()
        with mode:
            x = torch.randn(4, 3)
            ref = torch.sin(x) + x
        out = torch.compile(lambda x: torch.sin(x) + x, backend=backend)(x)
        self.assertOwnedLikeEager(out, ref, mode)

    @parametrize("backend", BACKENDS)
    def test_from_tensor_inputs(self, backend):
        mode = FakeTensorMode()
        x = mode.from_tensor(torch.randn(2, 8))
        with mode:
            ref = F.relu(x).view(4, 4)
        out = torch.compile(lambda x: F.relu(x).view(4, 4), backend=backend)(x)
        self.assertOwnedLikeEager(out, ref, mode)

    @parametrize("backend", BACKENDS)
    def test_no_tensor_inputs(self, backend):
        def fn(n):
            return torch.ones(n, 2) * 3, torch.arange(n)

        self.check_like_eager(fn, lambda: (5,), backend)

    # 4. Real and fake calls never share an artifact wrongly.
    @parametrize("backend", BACKENDS)
    def test_real_fake_real(self, backend):
        cnt = CompileCounterWithBackend(backend)
        fn = torch.compile(lambda x: x.sin() * 2 + 1, backend=cnt)
        real = torch.randn(8, 4)
        mode = FakeTensorMode()

        self.assertEqual(fn(real), real.sin() * 2 + 1)
        with mode:
            fake = torch.randn(8, 4)
            out = fn(fake)
        self.assertOwnedLikeEager(out, fake.sin() * 2 + 1, mode)
        self.assertEqual(fn(real), real.sin() * 2 + 1)
        # One entry per kind; the backend saw both graphs.
        self.assertEqual(frames_compiled(), 2)
        self.assertEqual(cnt.frame_count, 2)
        compiles = self.inductor_compiles
        if backend == "inductor":
            # The real values came from Inductor's code, compiled once.
            self.assertEqual(compiles, 1)

        for _ in range(2):
            self.assertEqual(fn(real), real.sin() * 2 + 1)
            with mode:
                self.assertIs(fn(fake).fake_mode, mode)
        self.assertEqual(frames_compiled(), 2)
        self.assertEqual(cnt.frame_count, 2)
        self.assertEqual(self.inductor_compiles, compiles)

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

    @parametrize("backend", BACKENDS)
    def test_no_tensor_inputs_real_then_fake(self, backend):
        fn = torch.compile(lambda: torch.ones(3) * 2, backend=backend)
        real = fn()
        self.assertNotIsInstance(real, FakeTensor)
        self.assertEqual(real, torch.full((3,), 2.0))
        mode = FakeTensorMode()
        with mode:
            out = fn()
        self.assertIsInstance(out, FakeTensor)
        self.assertIs(out.fake_mode, mode)
        self.assertEqual(fn(), torch.full((3,), 2.0))
        self.assertEqual(frames_compiled(), 2)

    def test_counterfactual_no_tensor_inputs_real_artifact_reused(self):
        # The bug this fixes: with the feature off, the real entry is reused
        # under the fake mode and a real tensor comes back.
        with torch._dynamo.config.patch(inherit_ambient_fake_mode=False):
            fn = torch.compile(lambda: torch.ones(3) * 2, backend="inductor")
            fn()
            with FakeTensorMode():
                out = fn()
        self.assertNotIsInstance(out, FakeTensor)

    def test_counterfactual_inductor_kernels_run_on_fakes(self):
        # With the feature off, Inductor's kernels run on the FakeTensors.
        with torch._dynamo.config.patch(inherit_ambient_fake_mode=False):
            with FakeTensorMode():
                x = torch.randn(4)
                with self.assertRaisesRegex(RuntimeError, "data pointer"):
                    torch.compile(lambda x: x * 2 + 1, backend="inductor")(x)

    @parametrize("requires_grad", [False, True])
    def test_steady_state_is_one_cache_hit_per_region(self, requires_grad):
        fn = torch.compile(lambda x: x.sin().cos().exp().sum(0), backend="inductor")
        mode = FakeTensorMode()
        with mode:
            x = torch.randn(4, 3, requires_grad=requires_grad)
            fn(x)
            before = FakeTensorMode.cache_info()
            out = fn(x)
            after = FakeTensorMode.cache_info()
        self.assertIs(out.fake_mode, mode)
        self.assertEqual(out.requires_grad, requires_grad)
        # The whole forward is one dispatch-cache hit, not one per op.
        self.assertEqual(after.hits - before.hits, 1)
        self.assertEqual(after.misses - before.misses, 0)
        if requires_grad:
            with mode:
                out.sum().backward()
            self.assertIs(x.grad.fake_mode, mode)
            self.assertEqual(meta_of(x.grad)[:6], meta_of(x)[:6])

    # 5. Models.
    @parametrize("backend", BACKENDS)
    def test_module_built_under_mode(self, backend):
        mode = FakeTensorMode()
        with mode:
            model = torch.nn.Sequential(
                torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)
            )
            x = torch.randn(2, 8)
            ref = model(x)
            out = torch.compile(model, backend=backend)(x)
        self.assertOwnedLikeEager(out, ref, mode)

    @parametrize("backend", BACKENDS)
    def test_real_params_allow_non_fake_inputs(self, backend):
        model = torch.nn.Linear(8, 4)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            x = torch.randn(3, 8)
            ref = model(x)
            out = torch.compile(model, backend=backend)(x)
        self.assertOwnedLikeEager(out, ref, mode)
        self.assertNotIsInstance(model.weight, FakeTensor)

    @parametrize("backend", BACKENDS)
    def test_training_backward(self, backend):
        mode = FakeTensorMode()
        with mode:
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
            compiled = torch.compile(model, backend=backend)
            loss = compiled(torch.randn(4, 8)).sum()
            loss.backward()
        for p in model.parameters():
            self.assertIsInstance(p.grad, FakeTensor)
            self.assertIs(p.grad.fake_mode, mode)
            self.assertEqual(p.grad.shape, p.shape)

    @parametrize("backend", BACKENDS)
    def test_batchnorm_running_stats_stay_fake(self, backend):
        mode = FakeTensorMode()
        with mode:
            bn = torch.nn.BatchNorm1d(6)
            out = torch.compile(bn, backend=backend)(torch.randn(4, 6))
        self.assertIs(out.fake_mode, mode)
        for buf in (bn.running_mean, bn.running_var, bn.num_batches_tracked):
            self.assertIsInstance(buf, FakeTensor)
            self.assertIs(buf.fake_mode, mode)

    # 6. Graph breaks, fullgraph, dynamic shapes, views, mutation and friends.
    @parametrize("backend", BACKENDS)
    def test_graph_break(self, backend):
        def fn(x):
            y = x * 2
            torch._dynamo.graph_break()
            return y + 1, y.sum()

        self.check_like_eager(fn, lambda: (torch.randn(3, 2),), backend)

    @parametrize("backend", BACKENDS)
    def test_fullgraph(self, backend):
        self.check_like_eager(
            lambda x: (x @ x.t()).softmax(-1),
            lambda: (torch.randn(4, 4),),
            backend,
            fullgraph=True,
        )

    def test_fullgraph_error_surfaces_under_fake(self):
        def fn(x):
            torch._dynamo.graph_break()
            return x + 1

        with FakeTensorMode():
            x = torch.randn(2)
            with self.assertRaisesRegex(
                torch._dynamo.exc.Unsupported, "graph_break"
            ):
                torch.compile(fn, backend="inductor", fullgraph=True)(x)

    @parametrize("backend", BACKENDS)
    def test_dynamic(self, backend):
        mode = FakeTensorMode()
        fn = torch.compile(lambda x: x.sum(0) + x.shape[0], backend=backend, dynamic=True)
        for n in (3, 5, 7):
            with mode:
                x = torch.randn(n, 2)
                self.assertOwnedLikeEager(fn(x), x.sum(0) + n, mode)
        self.assertEqual(frames_compiled(), 1)

    @parametrize("backend", BACKENDS)
    def test_automatic_dynamic(self, backend):
        mode = FakeTensorMode()
        fn = torch.compile(lambda x: torch.cat([x, x * 2]), backend=backend)
        for n in (3, 5, 9):
            with mode:
                x = torch.randn(n, 4)
                self.assertOwnedLikeEager(fn(x), torch.cat([x, x * 2]), mode)
        # static, then one dynamic recompile that serves every later size
        self.assertEqual(frames_compiled(), 2)

    @parametrize("backend", BACKENDS)
    def test_view_and_alias_outputs(self, backend):
        mode = FakeTensorMode()

        def fn(x):
            return x[1:], x.view(-1), x.t(), x

        with mode:
            x = torch.randn(4, 3)
            out = torch.compile(fn, backend=backend)(x)
            ref = fn(x)
        self.assertOwnedLikeEager(out, ref, mode)
        self.assertIs(out[3], x)
        for o in out[:3]:
            self.assertTrue(o._is_view())
            self.assertEqual(o.untyped_storage()._cdata, x.untyped_storage()._cdata)

    @parametrize("backend", BACKENDS)
    def test_inplace_mutation_of_inputs(self, backend):
        mode = FakeTensorMode()

        def fn(x, y):
            x.add_(1)
            y.mul_(2)
            return x + y

        with mode:
            a, b = torch.randn(3), torch.randn(3)
            fn(a, b)
            c, d = torch.randn(3), torch.randn(3)
            out = torch.compile(fn, backend=backend)(c, d)
        self.assertIs(out.fake_mode, mode)
        self.assertEqual(c._version, a._version)
        self.assertEqual(d._version, b._version)

    @parametrize("backend", BACKENDS)
    def test_mixed_outputs(self, backend):
        def fn(x):
            return {"y": x + 1, "n": x.shape[0] * 2, "none": None, "t": (x.sum(), 3.5)}

        self.check_like_eager(fn, lambda: (torch.randn(6, 2),), backend)

    @parametrize("backend", BACKENDS)
    def test_randomness(self, backend):
        def fn(x):
            return x + torch.rand_like(x), F.dropout(x, 0.5), torch.randn(2, 3)

        self.check_like_eager(fn, lambda: (torch.randn(4, 4),), backend)

    @parametrize("backend", BACKENDS)
    def test_autocast(self, backend):
        def fn(x, y):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return x @ y

        out = self.check_like_eager(
            fn, lambda: (torch.randn(4, 4), torch.randn(4, 4)), backend
        )
        self.assertEqual(out.dtype, torch.bfloat16)

    @parametrize("backend", BACKENDS)
    def test_no_grad_and_inference_mode(self, backend):
        def fn(x):
            with torch.no_grad():
                a = x * 2
            return a, x * 3

        self.check_like_eager(
            fn, lambda: (torch.randn(3, requires_grad=True),), backend
        )
        mode = FakeTensorMode()
        with mode, torch.inference_mode():
            x = torch.randn(3)
            out = torch.compile(lambda x: x + 1, backend=backend)(x)
        self.assertIs(out.fake_mode, mode)
        self.assertTrue(out.is_inference())

    # 7. Data-dependent ops raise as eager does.
    @parametrize("backend", BACKENDS)
    def test_item_raises_like_eager(self, backend):
        def fn(x):
            return x * x.sum().item()

        with FakeTensorMode():
            x = torch.randn(3)
            with self.assertRaises(DataDependentOutputException):
                fn(x)
            with self.assertRaises(DataDependentOutputException):
                torch.compile(fn, backend=backend)(x)

    # 8. Two modes, one after the other; mixing them.
    @parametrize("backend", BACKENDS)
    def test_two_modes_each_owns_its_outputs(self, backend):
        fn = torch.compile(lambda x: x.exp(), backend=backend)
        for mode in (FakeTensorMode(), FakeTensorMode()):
            with mode:
                out = fn(torch.randn(2, 2))
            self.assertIs(out.fake_mode, mode)

    @parametrize("backend", BACKENDS)
    def test_mixing_modes_raises_like_eager(self, backend):
        m1, m2 = FakeTensorMode(), FakeTensorMode()
        with m1:
            x = torch.randn(3)
        fn = lambda x: x * 2  # noqa: E731
        with self.assertRaisesRegex(AssertionError, "Mixing fake modes") as eager:
            with m2:
                fn(x)
        with self.assertRaisesRegex(AssertionError, "Mixing fake modes") as compiled:
            with m2:
                torch.compile(fn, backend=backend)(x)
        self.assertEqual(str(compiled.exception), str(eager.exception))
        self.assertIn(repr(m1), str(compiled.exception))
        self.assertIn(repr(m2), str(compiled.exception))

    # 9. FlopCounterMode counts what eager counts, forward and backward.
    @parametrize("backend", BACKENDS)
    def test_flop_counter(self, backend):
        def fn(a, b):
            return (a @ b).relu() @ b.t()

        mode = FakeTensorMode()
        with mode:
            a = torch.randn(16, 32, requires_grad=True)
            b = torch.randn(32, 8, requires_grad=True)
            with FlopCounterMode(display=False) as eager_flops:
                fn(a, b).sum().backward()
            compiled = torch.compile(fn, backend=backend)
            compiled(a, b).sum().backward()
            with FlopCounterMode(display=False) as compiled_flops:
                compiled(a, b).sum().backward()
        self.assertGreater(eager_flops.get_total_flops(), 0)
        self.assertEqual(
            compiled_flops.get_flop_counts()["Global"],
            eager_flops.get_flop_counts()["Global"],
        )

    # 10. A user mode with a ShapeEnv and symbolic input sizes.
    @parametrize("backend", BACKENDS)
    def test_user_shape_env_symbolic_inputs(self, backend):
        shape_env = ShapeEnv()
        mode = FakeTensorMode(shape_env=shape_env)
        x = mode.from_tensor(
            torch.randn(6, 4),
            symbolic_context=StatelessSymbolicContext(
                dynamic_sizes=[
                    torch.fx.experimental.symbolic_shapes.DimDynamic.DYNAMIC,
                    torch.fx.experimental.symbolic_shapes.DimDynamic.STATIC,
                ]
            ),
        )
        self.assertIsInstance(x.shape[0], torch.SymInt)
        with mode:
            ref = x * 2 + x.sum(0)
            out = torch.compile(lambda x: x * 2 + x.sum(0), backend=backend)(x)
        self.assertOwnedLikeEager(out, ref, mode)
        self.assertEqual(str(out.shape[0]), str(ref.shape[0]))

    # 11. Without a fake mode nothing changes.
    @parametrize("backend", BACKENDS)
    def test_real_path_unchanged(self, backend):
        cnt = CompileCounterWithBackend(backend)
        fn = torch.compile(lambda x, y: (x @ y).relu() + 1, backend=cnt)
        x, y = torch.randn(4, 4), torch.randn(4, 4)
        for _ in range(3):
            out = fn(x, y)
            self.assertNotIsInstance(out, FakeTensor)
            self.assertEqual(out, (x @ y).relu() + 1)
        self.assertEqual(cnt.frame_count, 1)
        fn(torch.randn(5, 4), torch.randn(4, 4))
        self.assertEqual(cnt.frame_count, 2)

    def test_graph_captured_under_fake_matches_real(self):
        def fn(x):
            return torch.relu(x) * 2

        graphs = {}
        for kind in ("real", "fake"):
            torch._dynamo.reset()
            backend = EagerAndRecordGraphs()
            with torch._dynamo.config.patch(compile_backend_under_fake_mode=True):
                ctx = FakeTensorMode() if kind == "fake" else contextlib.nullcontext()
                with ctx:
                    torch.compile(fn, backend=backend)(torch.randn(4))
            self.assertEqual(len(backend.graphs), 1)
            graphs[kind] = normalize_gm(backend.graphs[0].print_readable(False))
        self.assertEqual(graphs["fake"], graphs["real"])
        self.assertExpectedInline(
            graphs["fake"],
            """\
class GraphModule(torch.nn.Module):
    def forward(self, L_x_: "f32[4]"):
        l_x_ = L_x_

        relu: "f32[4]" = torch.relu(l_x_);  l_x_ = None
        mul: "f32[4]" = relu * 2;  relu = None
        return (mul,)
""",
        )

    def test_compile_backend_under_fake_mode_runs_backend_not_artifact(self):
        cnt = CompileCounterWithBackend("inductor")
        mode = FakeTensorMode()
        with torch._dynamo.config.patch(compile_backend_under_fake_mode=True):
            with mode:
                out = torch.compile(lambda x: x * 2 + 1, backend=cnt)(torch.randn(4))
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(self.inductor_compiles, 1)
        self.assertIs(out.fake_mode, mode)

    def test_export_unchanged(self):
        class M(torch.nn.Module):
            def forward(self, x):
                return x.sin() + 1

        ep = torch.export.export(M(), (torch.randn(3),))
        x = torch.randn(3)
        self.assertEqual(ep.module()(x), x.sin() + 1)
        with FakeTensorMode():
            ep = torch.export.export(M(), (torch.randn(3),))
        self.assertEqual(
            [n.op for n in ep.graph.nodes],
            ["placeholder", "call_function", "call_function", "output"],
        )


instantiate_parametrized_tests(CompileUnderFakeModeTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
