# Owner(s): ["module: inductor"]
"""
With config.fake_mode_plans_inductor_buffers, a call under a user's
FakeTensorMode compiled with Inductor runs Inductor's wrapper, lowered and
scheduled as for the real run, with no kernel compiled: it allocates the
buffers the real compiled run allocates. The real run's figures come from
the CPU allocator's events under torch.profiler. See Note [Inductor's buffers
in a fake call] in torch/_inductor/fake_mode_wrapper.py.
"""

import ast
import contextlib
import json
import os
import subprocess
import sys
import types
import unittest.mock
import warnings

import torch
import torch._dynamo.test_case
import torch.nn as nn
import torch.nn.functional as F
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.fake_mode_wrapper_instrumentation import planned_peaks
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.distributed._tools.mem_tracker import _ModState, MemTracker
from torch.profiler import profile, ProfilerActivity
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.utils._triton import has_triton_package


try:
    from .test_compile_under_fake_mode import CompileUnderFakeModeTestCase, meta_of
    from .test_compile_under_fake_mode_trackers import (
        needs_trackers_patch,
        Net,
        tracked,
        train_step,
        TRACKERS_SEE_COMPILED_RUN,
    )
except ImportError:
    from test_compile_under_fake_mode import CompileUnderFakeModeTestCase, meta_of
    from test_compile_under_fake_mode_trackers import (
        needs_trackers_patch,
        Net,
        tracked,
        train_step,
        TRACKERS_SEE_COMPILED_RUN,
    )


def real_peak(step):
    """The peak, above what was allocated before, of the CPU allocator's
    live bytes while step() runs."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]"
        and event.device_type() == torch.autograd.DeviceType.CPU
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def fake_peak(step, *external):
    """The peak, above what it tracks before (external's parameters,
    gradients and optimizer states), of MemTracker's total while step()
    runs. MemTracker sees a fake call's compiled run from torch 2.13 on (the
    trackers patch); before, the frame runs eagerly under it."""
    tracker = MemTracker()
    tracker.track_external(*external)
    with tracker:
        before = tracker.get_tracker_snapshot("current")
        step()
    peak = tracker.get_tracker_snapshot("peak")
    return sum(
        peak[device]["Total"] - before.get(device, {}).get("Total", 0)
        for device in peak
    )


class MLP(nn.Module):
    def __init__(self, dim=64, hidden=256):
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        # A pointwise chain Inductor fuses into one kernel.
        return self.down(torch.tanh(F.gelu(self.up(x)) * 2 + 1))


class Block(nn.Module):
    """A Llama-style block: RMSNorm, causal attention, SwiGLU."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.attention_norm = nn.RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.ffn_norm = nn.RMSNorm(dim)
        self.w13 = nn.Linear(dim, 8 * dim, bias=False)
        self.w2 = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (
            t.view(b, s, self.heads, -1).transpose(1, 2)
            for t in self.qkv(self.attention_norm(x)).chunk(3, dim=-1)
        )
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(attn.transpose(1, 2).reshape(b, s, d))
        gate, up = self.w13(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


# A named GPU's properties, as torch.cuda.get_device_properties gives them.
H100 = dict(
    name="NVIDIA H100 80GB HBM3",
    major=9,
    minor=0,
    total_memory=85045346304,
    multi_processor_count=132,
    warp_size=32,
    max_threads_per_block=1024,
    max_threads_per_multi_processor=2048,
    regs_per_multiprocessor=65536,
    shared_memory_per_block_optin=232448,
    shared_memory_per_multiprocessor=233472,
    L2_cache_size=52428800,
    gcnArchName="NONE",
    is_integrated=0,
)


def _emulate_gpu(properties):
    """
    Makes this process's Inductor see one CUDA GPU with properties, where
    none is: what it asks the device (properties, compute capability,
    Triton's target) answers as that GPU would, and the backend's pipeline
    runs as on a machine with it. The process never initializes CUDA; run
    it alone (these answers are process-wide).
    """
    import torch._dynamo.device_interface as device_interface
    import torch._dynamo.fake_mode_backend_graphs as backend_graphs
    import torch.utils._triton as triton_utils
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    gpu = types.SimpleNamespace(**properties)
    capability = (gpu.major, gpu.minor)
    backend_graphs._missing_device = lambda gm, example_inputs: None
    torch.cuda.get_device_properties = lambda device=None: gpu
    torch.cuda.get_device_capability = lambda device=None: capability
    cuda = device_interface.CudaInterface
    for interface in (cuda, cuda.Worker):
        interface.get_device_properties = staticmethod(lambda device=None: gpu)
        interface.current_device = staticmethod(lambda: 0)
    cuda.is_available = staticmethod(lambda: True)
    cuda.get_compute_capability = staticmethod(lambda device=None: gpu.major * 10 + gpu.minor)
    target = make_backend(GPUTarget("cuda", gpu.major * 10 + gpu.minor, gpu.warp_size))
    triton_utils.triton_backend = lambda: target
    if hasattr(triton_utils, "triton_hash_with_backend"):
        triton_utils.triton_hash_with_backend = lambda: f"emulated {gpu.name}"
    triton_utils.has_triton.cache_clear()


def _fake_cuda_calls_on_emulated_gpu(properties, mlp):
    """
    What _emulate_gpu's process sees of fake calls on CUDA FakeTensors with
    Inductor's buffers planned (json): planned_peaks() of a reduction, and
    whether CUDA was initialized; with mlp: planned_peaks() of the no_grad
    MLP (also with mode="reduce-overhead"), whether its outputs are the
    mode's CUDA FakeTensors, MemTracker's peak of its step unlowered and
    planned (where trackers see the compiled run), the devices of outputs
    computed on cuda:1, planned_peaks() of a graph called on an aligned and
    a misaligned view, and how many graphs are planned for a non_blocking
    copy to the host, with its output's device.
    """
    _emulate_gpu(properties)
    torch._dynamo.config.fake_mode_plans_inductor_buffers = True
    # Parameters stay uninitialized and inputs empty: a plan reads metadata
    # only.
    nn.Linear.reset_parameters = lambda self: None
    figures = {}

    def planned(fn, *args):
        with planned_peaks() as peaks:
            out = fn(*args)
        return [run.peak for run in peaks], out

    for mode in ("default", "reduce-overhead") if mlp else ():
        torch._dynamo.reset()
        with FakeTensorMode() as fake_mode:
            with torch.device("cuda"):
                model = MLP()
            compiled = torch.compile(model, backend="inductor", mode=mode)
            x = torch.empty(512, 64, device="cuda")
            with torch.no_grad():
                figures[mode], out = planned(compiled, x)
            figures["fake_outputs"] = (
                isinstance(out, FakeTensor) and out.fake_mode is fake_mode and out.device.type == "cuda"
            )
    for plans in (False, True) if mlp and TRACKERS_SEE_COMPILED_RUN else ():
        torch._dynamo.reset()
        with torch._dynamo.config.patch(fake_mode_plans_inductor_buffers=plans), FakeTensorMode():
            with torch.device("cuda"):
                model = MLP()
            compiled = torch.compile(model, backend="inductor")
            x = torch.empty(512, 64, device="cuda")

            def step():
                with torch.no_grad():
                    return compiled(x)

            step()
            figures["tracked planned" if plans else "tracked unlowered"] = fake_peak(step, model)
    if mlp:
        torch._dynamo.reset()
        with FakeTensorMode():
            x = torch.empty(64, 64, device="cuda:1")
            _, outs = planned(torch.compile(lambda x: (x.sin() * 2, x.mm(x)), backend="inductor"), x)
            figures["devices"] = [str(out.device) for out in outs]
            base = torch.empty(4001, device="cuda")
            double = torch.compile(lambda x: x * 2, backend="inductor")
            figures["aligned"], _ = planned(double, base[:4000])
            figures["misaligned"], _ = planned(double, base[1:])
            to_host = torch.compile(lambda x: (x * 2).to("cpu", non_blocking=True), backend="inductor")
            peaks, out = planned(to_host, x)
            figures["to_host"] = [len(peaks), str(out.device)]
    torch._dynamo.reset()
    with FakeTensorMode():
        x = torch.empty(4096, 4096, device="cuda")
        reduction = torch.compile(lambda x: x.var(0) + x.mean(1).sum(), backend="inductor")
        figures["reduction"], _ = planned(reduction, x)
    figures["cuda_initialized"] = torch.cuda.is_initialized()
    return json.dumps(figures)


def _in_process_of_its_own(function, *args):
    """function(*args) of this module (a json string), run in a new Python."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        f"import {__name__.rpartition('.')[2]} as t; print(t.{function.__name__}(*map(eval, sys.argv[2:])))"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    result = subprocess.run(
        [sys.executable, "-c", code, here, *map(repr, args)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode:
        raise AssertionError(result.stderr[-4000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


class InductorBuffersTests(CompileUnderFakeModeTestCase):
    def setUp(self):
        super().setUp()
        self._stack.enter_context(
            torch._dynamo.config.patch(fake_mode_plans_inductor_buffers=True)
        )

    def peaks(self, make, step):
        """step's peak in a real compiled run and in a fake one, each after
        a first call, on what make() returns built on real and on fake
        tensors."""
        figures = []
        for fake in (False, True):
            torch._dynamo.reset()
            with FakeTensorMode() if fake else contextlib.nullcontext():
                torch.manual_seed(0)
                model, *args = make()
                compiled = torch.compile(model, backend="inductor")
                step(compiled, *args)
                run = lambda: step(compiled, *args)  # noqa: E731
                figures.append(fake_peak(run, model) if fake else real_peak(run))
        return figures

    @needs_trackers_patch
    def test_no_grad_forward_allocates_what_the_real_run_does(self):
        def step(model, x):
            with torch.no_grad():
                return model(x)

        real, fake = self.peaks(lambda: (MLP(), torch.randn(512, 64)), step)
        # One buffer for the fused chain, reused: 512x256 floats.
        self.assertEqual(real, 512 * 256 * 4 + 512 * 64 * 4)
        self.assertEqual(fake, real)

    @needs_trackers_patch
    def test_forward_backward_allocates_what_the_real_run_does(self):
        def step(model, x):
            model(x).sum().backward()

        real, fake = self.peaks(lambda: (MLP(), torch.randn(512, 64)), step)
        self.assertEqual(fake, real)

    @needs_trackers_patch
    def test_llama_style_blocks_forward_backward(self):
        # Inductor's backward reuses the buffers of the activations the
        # forward saved, as it frees them.
        def step(model, x):
            model(x).sum().backward()

        real, fake = self.peaks(
            lambda: (nn.Sequential(Block(), Block()), torch.randn(2, 32, 64)), step
        )
        self.assertEqual(fake, real)

    @needs_trackers_patch
    @parametrize("backend", ["inductor", "aot_eager"])
    def test_compiled_optimizer_step_allocates_what_the_real_run_does(self, backend):
        # Inductor updates the parameters and the optimizer's state in place;
        # aot_eager runs prims.fma (Dynamo's addcmul_) through its kernel,
        # whose reference implementation makes a temporary.
        def make():
            model = MLP()
            for p in model.parameters():
                p.grad = torch.randn_like(p)
            return model, torch.optim.AdamW(model.parameters())

        figures = []
        for fake in (False, True):
            torch._dynamo.reset()
            with FakeTensorMode() if fake else contextlib.nullcontext():
                model, optimizer = make()
                step = torch.compile(optimizer.step, backend=backend)
                step()
                figures.append(
                    fake_peak(step, model, optimizer) if fake else real_peak(step)
                )
        real, fake = figures
        if backend == "inductor":
            self.assertEqual(fake, real)
        else:
            # But the 0-dim tensors the C++ argument parser wraps Python
            # scalars in (fma's), outside dispatch: 8 bytes each.
            self.assertLessEqual(real - fake, 64)
            self.assertGreaterEqual(real - fake, 0)

    @needs_trackers_patch
    def test_dynamic_sizes_allocate_what_the_real_run_does(self):
        def step(model, x):
            with torch.no_grad():
                return model(x)

        def make():
            x = torch.randn(512, 64)
            torch._dynamo.mark_dynamic(x, 0)
            return MLP(), x

        real, fake = self.peaks(make, step)
        self.assertEqual(fake, real)

    @needs_trackers_patch
    def test_trackers_see_eagers_rows(self):
        # Every module and category of eager's tables, with the compiled
        # run's figures; FLOPs per module are eager's, though the compiled
        # backward calls addmm where eager calls mm and add.
        def totals(flops):
            return {module: sum(ops.values()) for module, ops in flops.items()}

        with FakeTensorMode(), warnings.catch_warnings():
            warnings.simplefilter("error")
            x = torch.randn(4, 16, requires_grad=True)
            for tracker in ("FlopCounterMode", "MemTracker"):
                eager_model, model = Net(), Net()
                eager = tracked(tracker, eager_model, train_step(eager_model, eager_model, x))
                fn = torch.compile(lambda x: model(x), backend="inductor")
                fake = tracked(tracker, model, train_step(model, fn, x))
                if tracker == "FlopCounterMode":
                    self.assertEqual(totals(fake), totals(eager))
                    self.assertIn("aten.addmm", fake["Net.blocks.0.up"])
                else:
                    self.assertEqual(fake, eager)

    @needs_trackers_patch
    def test_each_module_holds_the_buffers_its_ops_allocate(self):
        def step(model, x):
            with torch.no_grad():
                return model(x)

        with FakeTensorMode():
            model, x = MLP(), torch.randn(512, 64)
            compiled = torch.compile(model, backend="inductor")
            step(compiled, x)
            tracker = MemTracker()
            with tracker:
                step(compiled, x)
        stats = {s.mod_fqn: s.snapshots for s in tracker.memory_tracking.values()}

        def total(module, state):
            (snapshot,) = stats[module][state]
            return snapshot[torch.device("cpu")]["Total"]

        pre, peak, post = _ModState.PRE_FW, _ModState.PEAK_FW, _ModState.POST_FW
        # up's addmm writes its buffer; the fused chain reuses it in place;
        # down's addmm writes its own.
        self.assertEqual(total("MLP.up", peak) - total("MLP.up", pre), 512 * 256 * 4)
        self.assertEqual(total("MLP.down", pre), total("MLP.up", post))
        self.assertEqual(total("MLP.down", peak) - total("MLP.down", pre), 512 * 64 * 4)
        self.assertEqual(total("MLP", peak), total("MLP.down", peak))

    def test_planned_peaks_are_the_real_runs(self):
        # Each graph's peak in Inductor's plan, the buffers alive at it and
        # the modules whose ops made them; here, the real run's peak.
        def step(model, x):
            with torch.no_grad():
                return model(x)

        torch.manual_seed(0)
        model, x = MLP(), torch.randn(512, 64)
        compiled = torch.compile(model, backend="inductor")
        step(compiled, x)
        real = real_peak(lambda: step(compiled, x))
        torch._dynamo.reset()
        with FakeTensorMode():
            model, x = MLP(), torch.randn(512, 64)
            compiled = torch.compile(model, backend="inductor")
            step(compiled, x)
            with planned_peaks() as peaks:
                step(compiled, x)
        (run,) = peaks
        self.assertEqual(run.peak, real)
        # The fused chain, MLP's own ops, writes up's buffer in place.
        self.assertEqual(
            sorted((b.module, b.nbytes) for b in run.buffers),
            [("", 512 * 256 * 4), ("down", 512 * 64 * 4)],
        )
        self.assertIn("forward: planned peak 0.6 MiB", str(peaks))

    def test_planned_backward_peak_is_the_real_runs(self):
        # The backward frees the saved tensors and tangents as it goes, and
        # its buffers take their place.
        def backward_peak(fake):
            torch._dynamo.reset()
            with FakeTensorMode() if fake else contextlib.nullcontext():
                torch.manual_seed(0)
                model, x = nn.Sequential(MLP(), MLP(), MLP()), torch.randn(512, 64)
                compiled = torch.compile(model, backend="inductor")
                compiled(x).sum().backward()
                loss = compiled(x).sum()
                if not fake:
                    return real_peak(loss.backward)
                with planned_peaks() as peaks:
                    loss.backward()
                (run,) = peaks
                self.assertTrue(run.graph.endswith("backward"))
                return run.peak

        # But the tangent sum().backward() makes outside the graph: 4 bytes.
        self.assertEqual(backward_peak(fake=True) + 4, backward_peak(fake=False))

    def test_a_wrapper_it_cannot_instrument_warns(self):
        # profiler_mark_wrapper_call puts the wrapper's call in a `with`: it
        # runs as generated, and who asked for its modules or peaks is told.
        with torch._inductor.config.patch(profiler_mark_wrapper_call=True), FakeTensorMode():
            model, x = MLP(), torch.randn(8, 64)
            compiled = torch.compile(model, backend="inductor")
            compiled(x)
            with self.assertWarnsRegex(UserWarning, "could not be instrumented"):
                with planned_peaks() as peaks:
                    compiled(x)
            self.assertEqual(peaks, [])
            if TRACKERS_SEE_COMPILED_RUN:
                with self.assertWarnsRegex(UserWarning, "could not be attributed"), MemTracker():
                    compiled(x)

    def test_symbolic_sizes_of_the_users_shape_env(self):
        # The wrapper's C++ size asserts cannot read symbolic sizes.
        from torch.fx.experimental.symbolic_shapes import (
            DimDynamic,
            ShapeEnv,
            StatelessSymbolicContext,
        )

        mode = FakeTensorMode(shape_env=ShapeEnv())
        context = StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC]
        )
        x = mode.from_tensor(torch.randn(16, 8), symbolic_context=context)
        w = mode.from_tensor(torch.randn(8, 4))
        with mode:
            out = torch.compile(lambda x, w: (x @ w).relu().t() * 2, backend="inductor")(
                x, w
            )
        self.assertEqual(out.shape, (4, x.shape[0]))
        self.assertEqual(out.stride(), (1, 4))
        self.assertEqual(self.inductor_compiles, 1)

    def test_a_graph_inductor_cannot_lower_fails_as_the_real_compile(self):
        # Inductor's own error, not the unlowered graphs.
        @torch.library.custom_op("fake_mode_buffers::twice", mutates_args=())
        def twice(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @twice.register_fake
        def _(x):
            return torch.empty_like(x)

        def compile_and_call(x):
            torch._dynamo.reset()
            with self.assertRaisesRegex(Exception, "missing lowering") as caught:
                torch.compile(lambda x: twice(x).sin(), backend="inductor")(x)
            return caught.exception

        with torch._inductor.config.patch(implicit_fallbacks=False):
            real = compile_and_call(torch.randn(8))
            with FakeTensorMode():
                fake = compile_and_call(torch.randn(8))
        self.assertIs(type(fake), type(real))

    @unittest.skipUnless(
        torch.backends.cuda.is_built() and has_triton_package(),
        "Inductor generates CUDA code with a CUDA build of torch and Triton",
    )
    @unittest.skipIf(
        torch.torch_version.TorchVersion(torch.__version__) < (2, 10),
        "before 2.10, AOTAutograd's trace of CUDA FakeTensors asks the device "
        "for its stream (in C++), which an emulated GPU cannot answer",
    )
    def test_cuda_plan_of_a_named_gpu_never_touches_a_device(self):
        # The plan Inductor makes for an H100, and for a GPU with 16 SMs,
        # each in a process that sees that GPU but has none.
        h100 = _in_process_of_its_own(_fake_cuda_calls_on_emulated_gpu, H100, True)
        small = _in_process_of_its_own(
            _fake_cuda_calls_on_emulated_gpu, dict(H100, multi_processor_count=16), False
        )
        self.assertFalse(h100["cuda_initialized"])
        self.assertTrue(h100["fake_outputs"])
        # The fused chain writes the mm's buffer in place, as on CPU, whose
        # real run test_no_grad_forward_allocates_what_the_real_run_does
        # measures: 512x256 floats and the 512x64 output. CUDA graphs are
        # off for a fake call's compile, and with them the graph partitions
        # whose buffers the plan would not see.
        fused = 512 * 256 * 4 + 512 * 64 * 4
        self.assertEqual(h100["default"], [fused])
        self.assertEqual(h100["reduce-overhead"], [fused])
        if TRACKERS_SEE_COMPILED_RUN:
            self.assertEqual(h100["tracked planned"], fused)
            self.assertGreater(h100["tracked unlowered"], fused)
        # Buffers are on the device the wrapper selects, as in the real run.
        self.assertEqual(h100["devices"], ["cuda:1", "cuda:1"])
        # A copy to the host is planned: no event is recorded on a device.
        self.assertEqual(h100["to_host"], [1, "cpu"])
        self.assertEqual(h100["aligned"], [4000 * 4])
        guards = torch._C._dynamo.guards
        if hasattr(guards, "copy_if_misaligned") or hasattr(guards, "copy_misaligned"):
            # The wrapper copies an input at a misaligned address (2.12 on).
            self.assertEqual(h100["misaligned"], [2 * 4000 * 4])
        # Inductor splits a reduction across the GPU's SMs: the buffers of
        # the partial results are the named GPU's.
        self.assertGreater(h100["reduction"], small["reduction"])

    def test_a_call_with_a_stream_context_is_not_instrumented(self):
        # Its statements in a `with` are not straight-line code; a device
        # guard's are.
        from torch._inductor.fake_mode_wrapper_instrumentation import instrument

        call = """
def call(args):
    arg0_1, = args
    args.clear()
    with torch.cuda._DeviceGuard(0):
        torch.cuda.set_device(0)
        buf0 = empty_strided_cuda((4, ), (1, ), torch.float32)
        {}
    return (buf0, )
"""
        graph = types.SimpleNamespace(graph=torch.fx.Graph(), name_to_buffer={})
        for statement, instrumented in (("del arg0_1", True), ("with stream1:\n            del arg0_1", False)):
            scope = {}
            instrument(ast.parse(call.format(statement)), graph, scope)
            self.assertEqual(scope.get("_fake_mode_instrumented", False), instrumented)

    def test_wrapper_that_reads_values_runs_unlowered(self):
        # torch.cond's predicate is read with .item() by the wrapper.
        def fn(x):
            return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos() + 1, (x,))

        with self.assertLogs("torch._inductor.fake_mode_wrapper", "WARNING") as logs:
            with FakeTensorMode():
                out = torch.compile(fn, backend="inductor")(torch.randn(8, 8))
        self.assertIn("reads the values of tensors", logs.output[0])
        self.assertIsInstance(out, FakeTensor)
        self.assertEqual(out.shape, (8, 8))

    def test_reinterpreted_buffer_is_the_cpp_helpers_alias(self):
        from torch._inductor.fake_mode_wrapper import _reinterpret_tensor

        def flags(alias):
            return alias.requires_grad, alias.is_inference(), alias._is_view(), alias.is_leaf

        mode = FakeTensorMode()
        real = nn.Parameter(torch.randn(4, 4))
        with mode:
            fake = nn.Parameter(torch.randn(4, 4))
        for grad_mode in (torch.enable_grad, torch.no_grad, torch.inference_mode):
            with grad_mode():
                expected = torch._C._dynamo.guards._reinterpret_tensor(real, (2, 4), (1, 2), 1)
                with mode:
                    alias = _reinterpret_tensor(fake, (2, 4), (1, 2), 1)
            self.assertEqual(flags(alias), flags(expected))
            self.assertEqual(meta_of(alias)[1:4], meta_of(expected)[1:4])
            self.assertEqual(alias.untyped_storage()._cdata, fake.untyped_storage()._cdata)

    def test_outputs_are_the_users_fake_tensors_with_the_real_metadata(self):
        def fn(x, w):
            y = (x @ w).relu()
            return y.t(), y.sum(0)

        args = (torch.randn(32, 16), torch.randn(16, 8))
        real = torch.compile(fn, backend="inductor")(*args)
        torch._dynamo.reset()
        mode = FakeTensorMode()
        # No kernel is compiled for the fake call.
        with mode, unittest.mock.patch.object(
            AsyncCompile, "cpp_pybinding", side_effect=AssertionError("compiled")
        ):
            fake = torch.compile(fn, backend="inductor")(
                *(mode.from_tensor(a) for a in args)
            )
        for r, f in zip(real, fake):
            self.assertIsInstance(f, FakeTensor)
            self.assertIs(f.fake_mode, mode)
            self.assertEqual(meta_of(f)[1:], meta_of(r)[1:])
        self.assertEqual(self.inductor_compiles, 2)

    def test_a_later_real_compile_compiles_its_kernels(self):
        # The fake compile's wrapper module is a private one: the real
        # compile of the same graph gets its own, with its kernels.
        fn = lambda x: torch.sin(x) * 2 + x  # noqa: E731
        with FakeTensorMode():
            torch.compile(fn, backend="inductor")(torch.randn(8, 8))
        x = torch.randn(8, 8)
        self.assertEqual(torch.compile(fn, backend="inductor")(x), fn(x))

    def test_mutated_input_version_is_the_real_runs(self):
        @torch.library.custom_op("fake_mode_buffers::add_one_", mutates_args=("x",))
        def add_one_(x: torch.Tensor) -> None:
            x.add_(1)

        @add_one_.register_fake
        def _(x):
            return None

        def fn(x):
            add_one_(x)
            return x * 2

        x = torch.randn(4)
        torch.compile(fn, backend="inductor")(x)
        torch._dynamo.reset()
        with FakeTensorMode():
            y = torch.randn(4)
            torch.compile(fn, backend="inductor")(y)
        self.assertEqual(y._version, x._version)


instantiate_parametrized_tests(InductorBuffersTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
