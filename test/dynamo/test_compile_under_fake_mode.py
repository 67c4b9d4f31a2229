# Owner(s): ["module: dynamo"]
"""
torch.compile called under a user-created FakeTensorMode, or on FakeTensors made
by one, behaves like the same function run eagerly under that mode: the capture
and the runtime. The tests of the later patches are in
test_compile_under_fake_mode_{guards,backends,trackers,optimizer,regions}.py,
which import what they share from this file: the helpers, the feature flags and
CompileUnderFakeModeTestCase.
See Note [Inheriting the ambient FakeTensorMode] in
torch/_dynamo/ambient_fake_mode.py
"""

import contextlib
import functools
import importlib.util
import threading
import unittest
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
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv, StatelessSymbolicContext
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import (
    checkpoint,
    CheckpointPolicy,
    create_selective_checkpoint_contexts,
)
from torch.utils.flop_counter import FlopCounterMode


BACKENDS = ["eager", "aot_eager", "inductor"]

# The same file runs against every patched release; a test of a feature a
# release lacks is skipped, naming the feature.
# aot_compile is on by default since torch 2.12 (before, it needs compile
# caches these tests turn off, and on 2.10 and 2.11 without a GPU entering a
# FakeTensorMode from a second thread crashes).
HAS_AOT_COMPILE = getattr(torch._dynamo.config, "enable_aot_compile", False)
# torch 2.11 has force_compile_during_fx_trace, but make_fx through a compiled
# function fails there (Dynamo's guard self-check, on make_fx's
# torch_fn_counts) in every tracing mode.
HAS_FORCE_COMPILE_DURING_FX_TRACE = hasattr(
    torch._dynamo.config, "force_compile_during_fx_trace"
) and torch.torch_version.TorchVersion(torch.__version__) >= (2, 12)
# FakeTensorMode's "Mixing fake modes" error names both modes since torch 2.12.
HAS_NAMED_MIXED_FAKE_MODES_ERROR = torch.torch_version.TorchVersion(
    torch.__version__
) >= (2, 12)
HAS_PRECOMPILE_PACKAGE = (
    importlib.util.find_spec("torch._dynamo.precompile_package") is not None
)

def meta_of(t):
    return (
        type(t),
        t.shape,
        t.stride(),
        t.storage_offset(),
        t.dtype,
        t.device,
        t.requires_grad,
        t._is_view(),
        t.untyped_storage().nbytes(),
    )


def frames_compiled():
    return counters["stats"]["unique_graphs"]


def regions_compiled():
    return counters["fake_mode"]["regions_compiled"]


def rotary(x, freqs):
    # Rotary embedding in complex numbers, as Llama implementations write it.
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs).flatten(-2).type_as(x)


class CompileUnderFakeModeTestCase(torch._dynamo.test_case.TestCase):
    """setUp, tearDown and the assertions the test files of the Note share. It
    holds no tests: a file that imports it collects only its own."""

    def setUp(self):
        super().setUp()
        # A FakeTensor's data pointer must never be read: that is what
        # Inductor's kernels would do if they ran on FakeTensors.
        self._stack = contextlib.ExitStack()
        # What this torch ships with, before a subclass's setUp changes it
        # (the stock counterfactual runs these tests on a torch without the
        # switch). The tests run the default path: regions are off.
        self.shipped_region_after_calls = getattr(
            torch._dynamo.config, "fake_mode_region_after_calls", None
        )
        self._stack.enter_context(
            torch._functorch.config.patch(
                fake_tensor_allow_unsafe_data_ptr_access=False
            )
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
            mock.patch.object(
                compile_fx, "_compile_fx_inner", counting_compile_fx_inner
            )
        )

    def tearDown(self):
        self._stack.close()
        # A region that fails to compile is logged, never silent.
        self.assertEqual(counters["fake_mode"]["regions_failed"], 0)
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

    def assertLikeCompiledRun(self, out, ref, mode):
        """
        out (compiled, called under mode) matches ref (the same compiled
        function called on real tensors): a fake call predicts the compiled
        run, whose metadata may differ from eager's (AOTAutograd returns fresh
        tensors where eager returns views; Inductor picks output strides).
        """
        flat_out, spec_out = torch.utils._pytree.tree_flatten(out)
        flat_ref, spec_ref = torch.utils._pytree.tree_flatten(ref)
        self.assertEqual(spec_out, spec_ref)
        for o, r in zip(flat_out, flat_ref):
            self.assertIsInstance(o, FakeTensor)
            self.assertIs(o.fake_mode, mode)
            self.assertEqual(meta_of(o)[1:], meta_of(r)[1:])

    def check_like_eager(self, fn, make_inputs, backend, mode=None, **compile_kwargs):
        mode = mode or FakeTensorMode()
        with mode:
            inputs = make_inputs()
            ref = fn(*inputs)
            inputs = make_inputs()
            out = torch.compile(fn, backend=backend, **compile_kwargs)(*inputs)
        self.assertOwnedLikeEager(out, ref, mode)
        return out


class CompileUnderFakeModeTests(CompileUnderFakeModeTestCase):
    # Outputs are FakeTensors owned by the mode, with eager's metadata.
    @parametrize("backend", BACKENDS)
    def test_outputs_owned_by_mode(self, backend):
        self.check_like_eager(
            lambda x: x * 2 + 1, lambda: (torch.randn(4, 3),), backend
        )

    @parametrize("backend", BACKENDS)
    def test_noncontiguous_and_dtype(self, backend):
        def fn(x, y):
            return x.t() @ y, (x.t() + 1).to(torch.float16), x.sum(0, keepdim=True)

        self.check_like_eager(
            fn, lambda: (torch.randn(5, 3), torch.randn(5, 2)), backend
        )

    # Inputs used outside the mode, from_tensor, no tensor inputs at all.
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

    # Models.
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

    # Graph breaks, fullgraph, dynamic shapes, views, mutation and friends.
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
            with self.assertRaisesRegex(torch._dynamo.exc.Unsupported, "graph_break"):
                torch.compile(fn, backend="inductor", fullgraph=True)(x)

    @parametrize("backend", BACKENDS)
    def test_dynamic(self, backend):
        mode = FakeTensorMode()
        fn = torch.compile(
            lambda x: x.sum(0) + x.shape[0], backend=backend, dynamic=True
        )
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

        # Version counters as the compiled run leaves them (eager's, but for
        # aot_eager's runtime, which writes its graph's mutations back).
        a, b = torch.randn(3), torch.randn(3)
        torch.compile(fn, backend=backend)(a, b)
        with mode:
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

    # Data-dependent ops raise as eager does.
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

    # Two modes, one after the other; mixing them.
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
        if HAS_NAMED_MIXED_FAKE_MODES_ERROR:
            self.assertIn(repr(m1), str(compiled.exception))
            self.assertIn(repr(m2), str(compiled.exception))

    # FlopCounterMode counts what eager counts, forward and backward.
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

    # A user mode with a ShapeEnv and symbolic input sizes.
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

    # Without a fake mode nothing changes.
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

    # Tracers own their FakeTensorModes: nothing changes for them.
    def _export_both_ways(self, make_module, args):
        graphs = []
        for inherit in (True, False):
            torch._dynamo.reset()
            with torch._dynamo.config.patch(inherit_ambient_fake_mode=inherit):
                ep = torch.export.export(make_module(), args, strict=False)
            graphs.append(ep)
        return graphs

    def assertNoRegion(self, gm):
        for node in gm.graph.nodes:
            self.assertNotIn("fake_mode_region", str(node.target))
            self.assertNotIn("inductor_compiled_code", str(node.target))

    @parametrize("hop", ["cond", "while_loop", "nested_compile_region"])
    def test_nonstrict_export_of_control_flow_is_unchanged(self, hop):
        @torch.compiler.nested_compile_region
        def region(x):
            return x.sin() + 1

        class M(torch.nn.Module):
            def forward(self, x):
                if hop == "cond":
                    return torch.cond(
                        x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,)
                    )
                if hop == "while_loop":
                    return torch._higher_order_ops.while_loop(
                        lambda i, x: i < 3, lambda i, x: (i + 1, x * 2), (0, x)
                    )[1]
                return region(x) * 2

        x = torch.randn(4)
        ep, ep_off = self._export_both_ways(M, (x,))
        self.assertNoRegion(ep.graph_module)
        self.assertEqual(
            normalize_gm(ep.graph_module.print_readable(False)),
            normalize_gm(ep_off.graph_module.print_readable(False)),
        )
        if hop != "nested_compile_region":
            targets = {n.target for n in ep.graph.nodes}
            self.assertIn(getattr(torch.ops.higher_order, hop), targets)
        # The exported program does not depend on anything Dynamo cached.
        torch._dynamo.reset()
        self.assertEqual(ep.module()(x), M()(x))
        self.assertNoRegion(ep.run_decompositions().graph_module)

    @unittest.skipUnless(
        HAS_FORCE_COMPILE_DURING_FX_TRACE,
        "make_fx traces through compiled functions (force_compile_during_fx_trace)"
        " since torch 2.12",
    )
    def test_make_fx_through_compiled_function_is_unchanged(self):
        fn = torch.compile(lambda x: x.sin() + 1, backend="eager")
        graphs = []
        for inherit in (True, False):
            torch._dynamo.reset()
            with torch._dynamo.config.patch(
                inherit_ambient_fake_mode=inherit, force_compile_during_fx_trace=True
            ):
                gm = make_fx(fn, tracing_mode="fake")(torch.randn(3))
            graphs.append(normalize_gm(gm.print_readable(False)))
        self.assertEqual(graphs[0], graphs[1])
        self.assertIn("aten.sin", graphs[0])

    # Complex tensors, conjugate views, and a real model's forward+backward.
    @parametrize("backend", BACKENDS)
    def test_complex_rotary_forward_backward(self, backend):
        mode = FakeTensorMode()
        compiled = torch.compile(rotary, backend=backend)

        def make_inputs():
            torch.manual_seed(0)
            x = torch.randn(2, 8, 4, 16, requires_grad=True)
            return x, torch.polar(torch.ones(8, 1, 8), torch.randn(8, 1, 8))

        # What the compiled run returns (eager returns a view; AOTAutograd
        # returns a fresh tensor).
        x, freqs = make_inputs()
        ref = compiled(x, freqs)
        ref.sum().backward()
        ref_grad = x.grad
        with mode:
            x, freqs = make_inputs()
            for _ in range(3):
                out = compiled(x, freqs)
                out.sum().backward()
                self.assertLikeCompiledRun(out, ref, mode)
                self.assertLikeCompiledRun(x.grad, ref_grad, mode)
                x.grad = None

    @parametrize("backend", BACKENDS)
    def test_conjugate_view_inputs(self, backend):
        def fn(a, b):
            return a * b + a.abs()

        mode = FakeTensorMode()
        compiled = torch.compile(fn, backend=backend)
        with mode:
            a = torch.randn(3, dtype=torch.complex64).conj()
            b = torch.randn(3, dtype=torch.complex64)
            self.assertTrue(a.is_conj())
            for _ in range(3):
                self.assertOwnedLikeEager(compiled(a, b), fn(a, b), mode)

    @parametrize("backend", BACKENDS)
    def test_transformer_encoder_forward_backward(self, backend):
        # Built on meta and materialized under the mode, as torchtitan does.
        with torch.device("meta"):
            enc = torch.nn.TransformerEncoder(
                torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2
            )
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        self._stack.enter_context(
            # Its forward asks for data pointers to pick a fast path.
            torch._functorch.config.patch(fake_tensor_allow_unsafe_data_ptr_access=True)
        )
        with mode:
            enc.to_empty(device="cpu")
            x = torch.randn(2, 5, 32)
            ref = enc(x)
            ref.sum().backward()
            ref_grads = [p.grad for p in enc.parameters()]
            compiled = torch.compile(enc, backend=backend)
            for _ in range(3):
                enc.zero_grad(set_to_none=True)
                out = compiled(x)
                out.sum().backward()
                self.assertOwnedLikeEager(out, ref, mode)
                self.assertOwnedLikeEager(
                    [p.grad for p in enc.parameters()], ref_grads, mode
                )

    @parametrize("backend", BACKENDS)
    def test_transformer_encoder_built_under_mode_raises_like_eager(self, backend):
        # Its layers are deepcopied, which gives their parameters a fake mode of
        # their own: eager raises, and the compiled call raises the same.
        self._stack.enter_context(
            # Its forward asks for data pointers to pick a fast path.
            torch._functorch.config.patch(fake_tensor_allow_unsafe_data_ptr_access=True)
        )
        with FakeTensorMode():
            enc = torch.nn.TransformerEncoder(
                torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2
            )
            x = torch.randn(2, 5, 32)
            with self.assertRaisesRegex(AssertionError, "Mixing fake modes") as eager:
                enc(x)
            with self.assertRaisesRegex(
                AssertionError, "Mixing fake modes"
            ) as compiled:
                torch.compile(enc, backend=backend)(x)
        self.assertEqual(str(compiled.exception), str(eager.exception))

    # Dispatch modes that see eager's ops, and that compile (DebugMode,
    # selective activation checkpointing's caching modes).
    @parametrize("backend", BACKENDS)
    def test_modes_that_compile_see_the_graphs_ops(self, backend):
        # A mode with ignore_compile_internals (as DebugMode and selective
        # checkpointing's modes have) lets frames compile; under it even a hot
        # entry runs op by op, so the mode sees the ops, not one region.
        class RecordingMode(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.ops = []

            @classmethod
            def ignore_compile_internals(cls):
                return True

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.ops.append(str(func))
                return func(*args, **(kwargs or {}))

        def fn(x):
            return (x.sin() * 2).relu().sum()

        # Regions serve entries that run op by op.
        self._stack.enter_context(
            torch._dynamo.config.patch(
                fake_mode_runs_backend_graphs=False, fake_mode_region_after_calls=1
            )
        )
        compiled = torch.compile(fn, backend=backend)
        with FakeTensorMode(), torch.no_grad():
            x = torch.randn(4, 3)
            with RecordingMode() as eager:
                fn(x)
            for _ in range(3):
                compiled(x)
            self.assertEqual(regions_compiled(), 1)
            with RecordingMode() as mode:
                compiled(x)
        self.assertGreater(len(eager.ops), 0)
        self.assertNotIn("fake_mode_region", mode.ops)
        self.assertEqual([op for op in mode.ops if op.startswith("aten.")], eager.ops)

    # Inductor's kernels are opaque to a mode in the real run; a fake call runs
    # its unlowered graphs op by op (see the README's known limits).
    @parametrize("backend", ["eager", "aot_eager"])
    def test_selective_checkpoint_policy_sees_the_compiled_runs_ops(self, backend):
        # The policy sees the ops the compiled run runs under it: eager's on
        # the eager backend, those of AOTAutograd's graphs on aot_eager.
        def fn(x):
            return (x.sin() * 2).relu()

        def ops_seen_by_policy(fn, mode):
            seen = []

            def policy(ctx, op, *args, **kwargs):
                seen.append(str(op))
                return CheckpointPolicy.PREFER_RECOMPUTE

            context_fn = functools.partial(create_selective_checkpoint_contexts, policy)
            with mode:
                x = torch.randn(4, 3, requires_grad=True)
                out = checkpoint(fn, x, use_reentrant=False, context_fn=context_fn)
                out.sum().backward()
            if isinstance(mode, FakeTensorMode):
                self.assertIs(x.grad.fake_mode, mode)
            return seen

        real = [
            ops_seen_by_policy(torch.compile(fn, backend=backend), contextlib.nullcontext())
            for _ in range(3)
        ]
        mode = FakeTensorMode()
        compiled = torch.compile(fn, backend=backend)
        self.assertEqual([ops_seen_by_policy(compiled, mode) for _ in range(3)], real)
        if backend == "eager":
            self.assertEqual(real[0], ops_seen_by_policy(fn, mode))

    # Backends that rewrite the graph they are given in place.
    def test_backend_rewriting_its_graph_in_place_does_not_change_fake_calls(self):
        def rewriting_backend(gm, example_inputs):
            for node in gm.graph.find_nodes(op="call_function", target=torch.sin):
                node.target = torch.sum
            gm.recompile()
            return gm.forward

        self.check_like_eager(
            lambda x: torch.sin(x) + 1, lambda: (torch.randn(4, 3),), rewriting_backend
        )

    # The captured mode belongs to the thread that compiles.
    @unittest.skipUnless(
        HAS_AOT_COMPILE, "aot_compile is enabled by default since torch 2.12"
    )
    def test_ambient_fake_mode_is_per_thread(self):
        # Thread A compiles under a fake mode and waits inside its backend;
        # meanwhile thread B compiles a function for real calls through
        # aot_compile, which does not take the compile lock: Inductor must
        # generate its code.
        in_backend, release = threading.Event(), threading.Event()

        def waiting_backend(gm, example_inputs):
            in_backend.set()
            release.wait(timeout=60)
            return gm.forward

        def compile_under_fake_mode():
            with FakeTensorMode():
                torch.compile(lambda x: x + 1, backend=waiting_backend)(torch.randn(2))

        thread = threading.Thread(target=compile_under_fake_mode)
        thread.start()
        try:
            self.assertTrue(in_backend.wait(timeout=60))

            def g(x):
                return x * 3

            x = torch.randn(2)
            with torch._dynamo.config.patch(enable_aot_compile=True):
                aot = torch.compile(g, backend="inductor", fullgraph=True).aot_compile(
                    ((x,), {})
                )
            self.assertEqual(aot(x), x * 3)
        finally:
            release.set()
            thread.join()
        self.assertEqual(self.inductor_compiles, 1)


instantiate_parametrized_tests(CompileUnderFakeModeTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
