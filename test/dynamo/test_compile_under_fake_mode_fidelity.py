# Owner(s): ["module: dynamo"]
"""
A fake call of a model compiled with a backend built on AOTAutograd predicts
the real compiled run: the forward saves for backward what the compiled
forward saves (the partitioner's choice: min-cut recomputation,
activation_memory_budget, checkpointing and selective-checkpoint policies),
the backward runs the compiled backward's ops, and outputs and gradients have
the compiled run's metadata. Every figure is checked against a real compiled
run of the same model on CPU. See Note [Inheriting the ambient FakeTensorMode]
in torch/_dynamo/ambient_fake_mode.py
"""

import collections
import functools
import itertools
import math
import unittest

import torch
import torch._dynamo.test_case
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
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


BACKENDS = ["aot_eager", "inductor"]


class MLP(nn.Module):
    def __init__(self, dim=64, layers=3):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x)) * torch.sigmoid(x)
        return x


class Block(nn.Module):
    """A Llama-style block: RMSNorm, causal SDPA, SwiGLU, optional complex RoPE."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.w1 = nn.Linear(dim, 2 * dim, bias=False)
        self.w3 = nn.Linear(dim, 2 * dim, bias=False)
        self.w2 = nn.Linear(2 * dim, dim, bias=False)
        self.norm1 = nn.Parameter(torch.ones(dim))
        self.norm2 = nn.Parameter(torch.ones(dim))

    @staticmethod
    def rms_norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    def forward(self, x, freqs_cis=None):
        b, t, d = x.shape
        q, k, v = self.qkv(self.rms_norm(x, self.norm1)).split(d, -1)
        q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2) for y in (q, k, v))
        if freqs_cis is not None:
            q_ = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
            k_ = torch.view_as_complex(k.float().reshape(*k.shape[:-1], -1, 2))
            q = torch.view_as_real(q_ * freqs_cis).flatten(3).type_as(v)
            k = torch.view_as_real(k_ * freqs_cis).flatten(3).type_as(v)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(attn.transpose(1, 2).reshape(b, t, d))
        h = self.rms_norm(x, self.norm2)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Checkpointed(nn.Module):
    def __init__(self, policy=None):
        super().__init__()
        self.block = Block()
        self.policy = policy

    def forward(self, x):
        if self.policy is None:
            return checkpoint(self.block, x, use_reentrant=False)
        context_fn = functools.partial(
            create_selective_checkpoint_contexts, self.policy
        )
        return checkpoint(self.block, x, use_reentrant=False, context_fn=context_fn)


def save_matmuls_and_attention(ctx, op, *args, **kwargs):
    if op in (
        torch.ops.aten.mm.default,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    ):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def make_case(name):
    """The model, its inputs, functorch config and autocast dtype of a case."""
    torch.manual_seed(0)
    config, autocast = {}, None
    if name in ("mlp", "mlp_budget_0.5"):
        model, inputs = MLP(), (torch.randn(32, 64, requires_grad=True),)
        if name == "mlp_budget_0.5":
            config = {"activation_memory_budget": 0.5}
    else:
        x = torch.randn(2, 16, 64, requires_grad=True)
        inputs = (x,)
        if name == "block":
            model = Block()
        elif name == "block_bf16_autocast":
            model, autocast = Block(), torch.bfloat16
        elif name == "complex_rope":
            freqs = torch.polar(torch.ones(16, 8), torch.randn(16, 8))
            model, inputs = Block(), (x, freqs)
        elif name == "checkpoint":
            model = Checkpointed()
        elif name == "selective_checkpoint":
            model = Checkpointed(save_matmuls_and_attention)
        else:
            raise KeyError(name)
    return model, inputs, config, autocast


CASES = [
    "mlp",
    "mlp_budget_0.5",
    "block",
    "block_bf16_autocast",
    "complex_rope",
    "checkpoint",
    "selective_checkpoint",
]


def is_compute_op(func):
    # Copies are left out: AOTAutograd's runtime may copy tangents outside
    # the graph, and Inductor runs some graph copies as aten fallbacks.
    if func in (torch.ops.aten.clone.default, torch.ops.aten._to_copy.default):
        return False
    return torch.Tag.pointwise in func.tags or func in (
        torch.ops.aten.mm.default,
        torch.ops.aten.addmm.default,
        torch.ops.aten.bmm.default,
    )


class ComputeOps(TorchDispatchMode):
    """The compute ops (pointwise and matmuls) that run under it."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if is_compute_op(func):
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


class ComputeOpsOfCompiledGraphs(ComputeOps):
    """
    ComputeOps that declares ignore_compile_internals(): Dynamo compiles
    frames under it (the mode is off while compiling) and it sees what the
    compiled artifacts run, not eager's ops.
    """

    @classmethod
    def ignore_compile_internals(cls):
        return True


# The RNG-state HOPs of checkpointed graphs run through it (each HOP asks the
# mode for a rule); their inner op is not counted, as in a graph's nodes.
for _hop, _mode in itertools.product(
    (run_and_save_rng_state, run_with_rng_state),
    (ComputeOps, ComputeOpsOfCompiledGraphs),
):
    _hop.py_impl(_mode)(
        functools.partial(lambda hop, mode, *args, **kwargs: hop(*args, **kwargs), _hop)
    )


def graph_compute_ops(gm):
    return collections.Counter(
        str(node.target)
        for node in gm.graph.nodes
        if node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and is_compute_op(node.target)
    )


def recording_inductor(backward_ops, forward_ops=None):
    """
    Inductor, recording the compute ops of the backward graphs it lowers (and
    of the forward graphs, given a list for them).
    """
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    def inner_compile(gm, example_inputs, **kwargs):
        # Counted before lowering: Inductor's post-grad passes rewrite gm in
        # place (mm + add -> addmm on CPU) on an FX graph cache miss only,
        # and a fake call runs the graph as it is given here.
        if kwargs.get("is_backward"):
            backward_ops.append(graph_compute_ops(gm))
        elif forward_ops is not None:
            forward_ops.append(graph_compute_ops(gm))
        return compile_fx_inner(gm, example_inputs, **kwargs)

    def backend(gm, example_inputs):
        return compile_fx(gm, example_inputs, inner_compile=inner_compile)

    return backend


def tensor_metadata(t):
    return (tuple(t.shape), t.stride(), t.dtype, t.requires_grad)


class Run:
    """What one forward+backward of a compiled model did."""

    def __init__(self, outputs, saved, backward_ops, grads):
        self.outputs = [tensor_metadata(t) for t in outputs]
        # What autograd saved for backward during the forward.
        self.saved = sorted((tuple(t.shape), t.dtype) for t in saved)
        self.saved_bytes = sum(math.prod(t.shape) * t.element_size() for t in saved)
        self.backward_ops = backward_ops
        self.grads = [tensor_metadata(g) for g in grads]


def run_forward_backward(model, inputs, backend, autocast, lowered_backward_ops=None):
    compiled = torch.compile(model, backend=backend)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            out = compiled(*inputs)
    compute_ops = ComputeOps()
    with compute_ops:
        out.sum().backward()
    if lowered_backward_ops is not None:
        # Inductor's kernels run no ops a mode could see: count the ops of
        # the backward graph it lowered.
        backward_ops = sum(lowered_backward_ops, collections.Counter())
    else:
        backward_ops = compute_ops.ops
    params = [p for p in model.parameters()]
    grads = [t.grad for t in (*inputs, *params) if isinstance(t, torch.Tensor) and t.requires_grad]
    return out, Run([out], saved, backward_ops, grads)


class CompileUnderFakeModeFidelityTests(torch._dynamo.test_case.TestCase):
    def real_and_fake_runs(self, case, backend):
        model, inputs, config, autocast = make_case(case)
        # No cache hit may skip the lowering that records the graphs.
        config = {**config, "enable_autograd_cache": False}
        with torch._functorch.config.patch(config):
            lowered_backward_ops = [] if backend == "inductor" else None
            real_backend = (
                recording_inductor(lowered_backward_ops)
                if backend == "inductor"
                else backend
            )
            _, real = run_forward_backward(
                model, inputs, real_backend, autocast, lowered_backward_ops
            )
            model.zero_grad(set_to_none=True)
            torch._dynamo.reset()
            with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                fake_inputs = [
                    mode.from_tensor(t.detach()).requires_grad_(t.requires_grad)
                    for t in inputs
                ]
                out, fake = run_forward_backward(model, fake_inputs, backend, autocast)
        self.assertIsInstance(out, FakeTensor)
        self.assertIs(out.fake_mode, mode)
        return real, fake

    @parametrize("backend", BACKENDS)
    @parametrize("case", CASES)
    def test_fake_call_predicts_the_compiled_run(self, case, backend):
        real, fake = self.real_and_fake_runs(case, backend)
        self.assertEqual(fake.saved, real.saved)
        self.assertEqual(fake.saved_bytes, real.saved_bytes)
        self.assertEqual(fake.backward_ops, real.backward_ops)
        self.assertEqual(fake.outputs, real.outputs)
        self.assertEqual(fake.grads, real.grads)

    @parametrize("backend", BACKENDS)
    def test_budget_below_one_saves_less_than_eager(self, backend):
        # The estimate changes with the partitioner's budget, as the compiled
        # run does: eager's figure is not the answer.
        full, _ = self.real_and_fake_runs("mlp", backend)
        _, half = self.real_and_fake_runs("mlp_budget_0.5", backend)
        self.assertLess(half.saved_bytes, full.saved_bytes)
        model, inputs, _, _ = make_case("mlp")
        _, eager = run_forward_backward(model, inputs, "eager", None)
        self.assertLess(half.saved_bytes, eager.saved_bytes)

    def test_op_by_op_switch_predicts_eager(self):
        model, inputs, _, _ = make_case("mlp_budget_0.5")
        _, eager = run_forward_backward(model, inputs, "eager", None)
        model.zero_grad(set_to_none=True)
        with torch._functorch.config.patch(activation_memory_budget=0.5):
            with torch._dynamo.config.patch(fake_mode_runs_backend_graphs=False):
                with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                    x = mode.from_tensor(inputs[0].detach()).requires_grad_()
                    _, fake = run_forward_backward(model, (x,), "inductor", None)
        self.assertEqual(fake.saved, eager.saved)
        self.assertEqual(fake.backward_ops, eager.backward_ops)

    def test_custom_aot_backend_compilers_are_not_called(self):
        # A custom aot_autograd backend's partitioner and decompositions shape
        # the graphs a fake call runs; its compilers' artifacts, which need
        # real tensors, are never built.
        from functorch.compile import min_cut_rematerialization_partition

        compiled_graphs = []

        def compiler(gm, example_inputs):
            compiled_graphs.append(gm)
            return gm

        backend = aot_autograd(
            fw_compiler=compiler,
            partition_fn=min_cut_rematerialization_partition,
        )
        counter = CompileCounterWithBackend(backend)
        model, inputs, _, _ = make_case("mlp")
        _, real = run_forward_backward(model, inputs, backend, None)
        self.assertEqual(len(compiled_graphs), 2)
        model.zero_grad(set_to_none=True)
        torch._dynamo.reset()
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            x = mode.from_tensor(inputs[0].detach()).requires_grad_()
            out, fake = run_forward_backward(model, (x,), counter, None)
        self.assertIs(out.fake_mode, mode)
        self.assertEqual(counter.frame_count, 1)
        self.assertEqual(len(compiled_graphs), 2)
        self.assertEqual(fake.saved, real.saved)
        self.assertEqual(fake.backward_ops, real.backward_ops)

    def test_fake_call_fills_no_cache_a_real_call_reads(self):
        # The unlowered graphs of a fake call must never serve a real call,
        # even with AOTAutograd's and Inductor's caches on.
        model, inputs, _, _ = make_case("mlp")
        compiled = torch.compile(model, backend="inductor")
        with torch._functorch.config.patch(enable_autograd_cache=True):
            with torch._inductor.config.patch(fx_graph_cache=True):
                with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                    x = mode.from_tensor(inputs[0].detach()).requires_grad_()
                    self.assertIs(compiled(x).fake_mode, mode)
                torch._dynamo.reset()
                compiled = torch.compile(model, backend="inductor")
                out = compiled(*inputs)
        self.assertNotIsInstance(out, FakeTensor)
        self.assertEqual(out, model(*inputs))

    @unittest.skipUnless(
        hasattr(TorchDispatchMode, "ignore_compile_internals"),
        "dispatch modes declare ignore_compile_internals() from torch 2.9",
    )
    @parametrize("backend", BACKENDS)
    def test_a_mode_ignoring_compile_internals_sees_the_compiled_graphs(
        self, backend
    ):
        # A dispatch mode that declares ignore_compile_internals() asks for
        # the compiled run, not eager's ops: under it a fake call compiles
        # and the mode sees the compute ops of the forward and backward
        # graphs the backend builds for the real run (at budget 0.5 the
        # backward recomputes what eager saves). Modes that do not declare it
        # (the default: FlopCounterMode, MemTracker) see eager's ops.
        model, inputs, config, _ = make_case("mlp_budget_0.5")
        config = {**config, "enable_autograd_cache": False}

        def forward_backward_under_mode(backend, inputs, mode):
            compiled = torch.compile(model, backend=backend)
            with mode:
                compiled(*inputs).sum().backward()
            model.zero_grad(set_to_none=True)
            torch._dynamo.reset()
            return mode.ops

        with torch._functorch.config.patch(config):
            if backend == "inductor":
                # Inductor's kernels run no ops a mode could see: count the
                # ops of the graphs it lowers.
                forward_ops, backward_ops = [], []
                real_backend = recording_inductor(backward_ops, forward_ops)
                cnt = CompileCounterWithBackend(real_backend)
                forward_backward_under_mode(cnt, inputs, ComputeOpsOfCompiledGraphs())
                real = sum(forward_ops + backward_ops, collections.Counter())
            else:
                cnt = CompileCounterWithBackend(backend)
                real = forward_backward_under_mode(
                    cnt, inputs, ComputeOpsOfCompiledGraphs()
                )
            self.assertEqual(cnt.frame_count, 1)
            eager = forward_backward_under_mode("eager", inputs, ComputeOps())
            with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                fake_inputs = [
                    mode.from_tensor(t.detach()).requires_grad_() for t in inputs
                ]
                cnt = CompileCounterWithBackend(backend)
                fake = forward_backward_under_mode(
                    cnt, fake_inputs, ComputeOpsOfCompiledGraphs()
                )
                self.assertEqual(cnt.frame_count, 1)
                # Without the declaration the frame runs eagerly under the
                # mode, as on stock.
                cnt = CompileCounterWithBackend(backend)
                fake_eager = forward_backward_under_mode(cnt, fake_inputs, ComputeOps())
                self.assertEqual(cnt.frame_count, 0)
        self.assertEqual(fake, real)
        self.assertNotEqual(fake, eager)
        self.assertEqual(fake_eager, eager)

    # Cases where AOTAutograd's runtime meets FakeTensors as eager does not.
    @parametrize("backend", BACKENDS)
    def test_backward_after_leaving_the_mode(self, backend):
        with FakeTensorMode() as mode:
            lin = nn.Linear(8, 8)
            x = torch.randn(4, 8, requires_grad=True)
            out = torch.compile(lambda x: lin(x).relu(), backend=backend)(x)
        # The tangent of sum() is an expanded tensor that AOTAutograd copies;
        # relu's backward makes a scalar tensor.
        out.sum().backward()
        self.assertIs(lin.weight.grad.fake_mode, mode)
        self.assertIs(x.grad.fake_mode, mode)

    @parametrize("backend", BACKENDS)
    def test_fake_inputs_without_an_active_mode(self, backend):
        with FakeTensorMode() as mode:
            lin = nn.Linear(8, 8)
            x = torch.randn(4, 8, requires_grad=True)
        out = torch.compile(lambda x: lin(x).relu() * 2, backend=backend)(x)
        out.sum().backward()
        self.assertIs(out.fake_mode, mode)
        self.assertIs(lin.weight.grad.fake_mode, mode)

    @parametrize("backend", BACKENDS)
    def test_input_mutation_under_inference_mode(self, backend):
        def fn(x):
            x.add_(1)
            return x * 2

        with FakeTensorMode() as mode, torch.inference_mode():
            x = torch.randn(4)
            out = torch.compile(fn, backend=backend)(x)
        self.assertIs(out.fake_mode, mode)
        self.assertTrue(out.is_inference())

    @parametrize("backend", BACKENDS)
    def test_data_dependent_sizes_run_op_by_op(self, backend):
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        def fn(x, w):
            return (w[torch.nonzero(x > 0).squeeze(-1)] * 2).sin()

        with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
            with FakeTensorMode(shape_env=ShapeEnv()) as mode:
                x, w = torch.randn(8), torch.randn(8, 4, requires_grad=True)
                with self.assertLogs(
                    "torch._dynamo.fake_mode_backend_graphs", "WARNING"
                ) as logs:
                    out = torch.compile(fn, backend=backend, fullgraph=True)(x, w)
                out.sum().backward()
        self.assertIn("data-dependent sizes", logs.output[0])
        self.assertIs(out.fake_mode, mode)
        self.assertEqual(w.grad.shape, w.shape)

    def test_freezing_keeps_the_users_parameters(self):
        # A dry run never changes the model a later real call runs (freezing
        # would discard the parameters it folded).
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).eval()
        x = torch.randn(4, 8)
        with torch.no_grad(), torch._inductor.config.patch(
            freezing=True, freezing_discard_parameters=True
        ):
            ref = model(x)
            with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                out = torch.compile(model)(torch.randn(4, 8))
            self.assertIs(out.fake_mode, mode)
            self.assertIsInstance(model[0].weight, nn.Parameter)
            self.assertEqual(model(x), ref)

    # Steady state: a repeated fake call makes fresh FakeTensors of what the
    # backend's graphs made on an earlier call with the same inputs'
    # metadata, without running their ops, and predicts the same.
    @parametrize("backend", BACKENDS)
    @parametrize("case", ["mlp_budget_0.5", "block_bf16_autocast", "complex_rope"])
    def test_repeated_fake_calls_predict_what_the_first_did(self, case, backend):
        model, inputs, config, autocast = make_case(case)
        runs = []
        with torch._functorch.config.patch(config):
            with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                fake_inputs = [
                    mode.from_tensor(t.detach()).requires_grad_(t.requires_grad)
                    for t in inputs
                ]
                for _ in range(3):
                    model.zero_grad(set_to_none=True)
                    for t in fake_inputs:
                        t.grad = None
                    out, run = run_forward_backward(model, fake_inputs, backend, autocast)
                    self.assertIs(out.fake_mode, mode)
                    runs.append(run)
        self.assertGreater(counters["fake_mode"]["graphs_replayed"], 0)
        for run in runs[1:]:
            self.assertEqual(vars(run), vars(runs[0]))

    # What a replay cannot make (an input written in place, an output that is
    # an input's view) stays as the compiled run has it on every call; sizes
    # that change get their own replay.
    @parametrize("backend", BACKENDS)
    def test_repeated_fake_calls_keep_mutations_aliases_and_sizes(self, backend):
        def fn(x, y):
            y.add_(1)
            return x.view(-1), (x * 2).t()

        def calls(x, y):
            compiled = torch.compile(fn, backend=backend, dynamic=True)
            seen = []
            for rows in (4, 6, 4, 6):
                view, out = compiled(x[:rows], y)
                seen.append(
                    (
                        tuple(out.shape),
                        out.stride(),
                        y._version,
                        view._base is not None,
                        view.untyped_storage().nbytes(),
                    )
                )
            return seen

        real = calls(torch.randn(6, 3), torch.randn(3))
        torch._dynamo.reset()
        with FakeTensorMode():
            fake = calls(torch.randn(6, 3), torch.randn(3))
        self.assertEqual(fake, real)

    # Dtype views of outputs (view(dtype), view_as_real, view_as_complex)
    # keep their dtype on every call, replayed or not, as in the compiled run.
    @parametrize("backend", BACKENDS)
    def test_repeated_fake_calls_keep_dtype_views(self, backend):
        def fn(x):
            y = x * 2
            yc = torch.view_as_complex(x.reshape(4, 3, 2) + 0)
            return y, y.view(torch.int32), torch.view_as_real(yc * 2), yc * 1

        def calls(make_input):
            compiled = torch.compile(fn, backend=backend)
            with torch.no_grad():
                return [
                    [
                        (o.dtype, o.shape, o.stride(), o.storage_offset(), o._is_view())
                        for o in compiled(make_input())
                    ]
                    for _ in range(4)
                ]

        real = calls(lambda: torch.randn(4, 6))
        torch._dynamo.reset()
        counters.clear()
        with FakeTensorMode():
            fake = calls(lambda: torch.randn(4, 6))
        # Replayed calls give what the first, which ran the graphs, gave.
        self.assertEqual(fake, [fake[0]] * 4)
        self.assertEqual(
            [meta[:4] for meta in fake[0]], [meta[:4] for meta in real[0]]
        )
        self.assertEqual(
            [meta[0] for meta in fake[0]],
            [torch.float32, torch.int32, torch.float32, torch.complex64],
        )
        self.assertGreater(counters["fake_mode"]["graphs_replayed"], 0)

    # A replay gives what running the graphs gives: under inference mode, for
    # inputs that are one tensor in some calls and two in others, for a
    # constant input, and for an output that is also saved for backward.
    @parametrize("backend", BACKENDS)
    def test_replays_give_what_running_the_graphs_gives(self, backend):
        def same_storage(a, b):
            return a.untyped_storage()._cdata == b.untyped_storage()._cdata

        affine = torch.compile(lambda x: x * 2 + 1, backend=backend)
        pair = torch.compile(lambda x, y: (x + 1, y + 1), backend=backend)
        exp = torch.compile(torch.exp, backend=backend)
        seen = []
        for call in range(4):
            with FakeTensorMode() as mode:
                with torch.inference_mode():
                    self.assertIs(affine(torch.randn(3)).fake_mode, mode)
                # One tangent for both outputs, two in the last call.
                x, y = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
                g1 = torch.randn(4)
                g2 = g1 if call < 3 else torch.randn(4)
                gx, gy = torch.autograd.grad(pair(x, y), [x, y], [g1, g2])
                saved = []
                with torch.autograd.graph.saved_tensors_hooks(
                    lambda t: saved.append(t) or t, lambda t: t
                ):
                    out = exp(torch.randn(4, requires_grad=True))
                seen.append((same_storage(gx, g1), same_storage(gy, g2), [t is out for t in saved]))
                # A constant after calls without one: eager keeps its value.
                if call == 3:
                    self.assertEqual(affine(torch.tensor(2.0)).item(), 5.0)
        self.assertGreater(counters["fake_mode"]["graphs_replayed"], 0)
        self.assertEqual(seen, [seen[0]] * 4)

    @unittest.skipUnless(
        torch.backends.cuda.is_built(),
        "a CPU-only build of torch aborts on fake cuda tensors, in eager too",
    )
    @parametrize("backend", BACKENDS)
    def test_fake_cuda_inputs_need_no_gpu(self, backend):
        # The backend's pipeline needs the device (the autograd engine traces
        # a backward only where it exists; Inductor folds constants on it):
        # without one, the graph runs op by op, and a warning says so. An
        # MLP, under no_grad: before 2.10, tracing attention or autograd over
        # fake cuda tensors asks for a device, in eager too.
        with torch.device("meta"):
            model, (x,), _, _ = make_case("mlp")
        with FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.no_grad():
            model = model.to_empty(device="cuda")
            x = torch.empty(x.shape, device="cuda")
            compiled = torch.compile(model, backend=backend)
            if torch.cuda.is_available():
                out = compiled(x)
            else:
                with self.assertLogs(
                    "torch._dynamo.fake_mode_backend_graphs", "WARNING"
                ) as logs:
                    out = compiled(x)
                self.assertIn("needs a cuda device", logs.output[0])
            self.assertEqual(out.device.type, "cuda")
            self.assertEqual(out.shape, x.shape)
            self.assertIs(out.fake_mode, mode)


instantiate_parametrized_tests(CompileUnderFakeModeFidelityTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
