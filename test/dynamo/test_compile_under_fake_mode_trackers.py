# Owner(s): ["module: dynamo"]
"""
Trackers PyTorch ships (FlopCounterMode, MemTracker, CommDebugMode) around
compiled code called under a user-created FakeTensorMode: trackers that only
observe see the compiled run (the backend's forward and backward graphs) in
eager's rows (every module, forward and backward, attributed from the
graphs' metadata), checked against eager and against a real compiled run on
CPU; fullgraph=True holds; nothing process-wide changes during a call, and
two threads get their own figures. CommDebugMode (a global backward hook) and
frames under a dispatch mode that may change what ops return run eagerly, as
on stock, with a warning.
test_compile_under_fake_mode_memory_estimation.py runs torchtitan's memory
estimator through this path.
See Note [Trackers see the compiled run of a fake call] in
torch/_dynamo/fake_mode_trackers.py
"""

import contextlib
import functools
import importlib.util
import threading
import unittest

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
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
    from .test_compile_under_fake_mode_fidelity import make_case
except ImportError:
    from test_compile_under_fake_mode import (
        BACKENDS,
        CompileUnderFakeModeTestCase,
        meta_of,
    )
    from test_compile_under_fake_mode_fidelity import make_case


class MLP(torch.nn.Module):
    def __init__(self, breaks=False):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.act = torch.nn.GELU()
        self.down = torch.nn.Linear(32, 16)
        self.breaks = breaks

    def forward(self, x):
        h = self.act(self.up(x))
        if self.breaks:
            torch._dynamo.graph_break()
        return self.down(h) + x


class Net(torch.nn.Module):
    # Nested modules, a buffer, and a module called outside the blocks.
    def __init__(self, breaks=False):
        super().__init__()
        self.blocks = torch.nn.Sequential(MLP(breaks), MLP(breaks))
        self.head = torch.nn.Linear(16, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        return self.head(self.blocks(x)) * self.scale


FORMS = [
    "torch.compile(fn)",
    "torch.compile(module)",
    "Module.compile()",
    "blocks compiled in place",
]


def compiled(form, model, backend, fullgraph):
    """The compiled forms users write."""
    if form == "torch.compile(module)":
        return torch.compile(model, backend=backend, fullgraph=fullgraph)
    if form == "Module.compile()":
        model.compile(backend=backend, fullgraph=fullgraph)
        return model
    if form == "blocks compiled in place":
        # torchtitan's pattern: the model stays uncompiled.
        for block in model.blocks:
            block.compile(backend=backend, fullgraph=fullgraph)
        return model
    # torch.compile(fn) calling the module
    return torch.compile(lambda x: model(x), backend=backend, fullgraph=fullgraph)


MEM_CATEGORIES = ("PARAM", "BUFFER", "GRAD", "OPT")


def tracked(tracker, model, step):
    """What a tracker reports for one forward+backward step: FLOPs per module
    and op; MemTracker's modules (their parameters' and buffers' bytes), its
    parameters, buffers, gradients and optimizer state after the step and
    at the peak (activations and temporaries are the compiled run's);
    CommDebugMode's counts."""
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
            (after,) = mem_tracker.get_tracker_snapshot().values()
        (peak,) = mem_tracker.get_tracker_snapshot("peak").values()

        def categories(snapshot, names):
            return {
                str(kind).split(".")[-1]: n
                for kind, n in snapshot.items()
                if str(kind).split(".")[-1] in names
            }

        return {
            "modules": {
                stats.mod_fqn: (stats.parameter_mem, stats.buffer_mem)
                for stats in mem_tracker.memory_tracking.values()
            },
            "after the step": categories(after, MEM_CATEGORIES),
            # Which gradients exist at the peak is the compiled run's.
            "peak": categories(peak, ("PARAM", "BUFFER", "OPT")),
        }
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as comm:
        step()
    return {"comm counts": dict(comm.get_comm_counts())}


# Trackers see the compiled run where the series carries the trackers patch
# (torch 2.13+); before, frames under a tracker run eagerly, as on stock.
TRACKERS_SEE_COMPILED_RUN = (
    importlib.util.find_spec("torch._dynamo.fake_mode_trackers") is not None
)
needs_trackers_patch = unittest.skipUnless(
    TRACKERS_SEE_COMPILED_RUN, "trackers see the compiled run from torch 2.13"
)


def train_step(model, fn, x):
    def run():
        # Each step starts without gradients, as the first did.
        model.zero_grad(set_to_none=True)
        x.grad = None
        fn(x).sum().backward()

    return run


def saved_activations(model, inputs, backend):
    """
    Bytes of the storages a real compiled forward saves for backward (but the
    parameters' and the inputs') and of its output's, and that output.
    """
    torch._dynamo.reset()
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = torch.compile(model, backend=backend)(*inputs)
    for t in (*model.parameters(), *model.buffers(), *inputs):
        saved.pop(t.untyped_storage().data_ptr(), None)
    saved[out.untyped_storage().data_ptr()] = out.untyped_storage().nbytes()
    return sum(saved.values()), out


def gradients_match_eager(model, inputs, out):
    """Whether the gradients of out, a compiled run's output, are eager's."""
    wrt = [*model.parameters(), *inputs]
    compiled = torch.autograd.grad(out.sum(), wrt)
    eager = torch.autograd.grad(model(*inputs).sum(), wrt)
    return all(torch.allclose(c, e, atol=1e-5) for c, e in zip(compiled, eager))


def mem_tracker_activations(compiled_model, model, fake_inputs):
    """MemTracker's activations after a fake call's forward, and its output."""
    from torch.distributed._tools.mem_tracker import MemTracker

    mem_tracker = MemTracker()
    mem_tracker.track_external(model, *fake_inputs)
    with mem_tracker:
        out = compiled_model(*fake_inputs)
        after_forward = mem_tracker.get_tracker_snapshot("current")
        out.sum().backward()
    activations = {str(kind): n for kind, n in after_forward[out.device].items()}
    return activations["_MemRefType.ACT"], out


@torch.library.custom_op("fake_mode_trackers_test::scale_", mutates_args=("buf",))
def scale_(buf: torch.Tensor, x: torch.Tensor) -> None:
    buf.copy_(x * 2)


@scale_.register_fake
def _(buf, x):
    return None


class MutatesABuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.register_buffer("buf", torch.zeros(4, 8))

    def forward(self, x):
        y = self.linear(x)
        scale_(self.buf, y.detach())
        return torch.tanh(y) + self.buf


@torch.compiler.nested_compile_region
def region(linear, x):
    return torch.tanh(linear(x))


class CallsARegionTwice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return region(self.linear, region(self.linear, x))


@torch.compiler.nested_compile_region
def mutating_region(linear, buf, x):
    y = linear(x)
    scale_(buf, y)
    return y + buf


class MutatesInARegion(MutatesABuffer):
    # MutatesABuffer's linear and buffer, mutated inside a region
    def forward(self, x):
        y = mutating_region(self.linear, self.buf, mutating_region(self.linear, self.buf, x))
        # a tensor constant of the graph: shared, not copied under the modes,
        # when the graph is rewritten for trackers
        return y + torch.tensor([1.0] * 8)


class AddsAConstantToARegion(CallsARegionTwice):
    def forward(self, x):
        # a tensor constant of the graph beside the region's calls
        return super().forward(x) + torch.tensor([1.0] * 8)


def _recompute_everything(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.PREFER_RECOMPUTE


class Checkpointed(torch.nn.Module):
    # Its layers under a selective-checkpoint policy that saves nothing.
    def __init__(self, layers):
        super().__init__()
        self.layers = layers

    def forward(self, x):
        from torch.utils.checkpoint import (
            checkpoint,
            create_selective_checkpoint_contexts,
        )

        return checkpoint(
            self.layers,
            x,
            use_reentrant=False,
            context_fn=functools.partial(
                create_selective_checkpoint_contexts, _recompute_everything
            ),
        )


HOP_CASES = {
    "mutating_custom_op": MutatesABuffer,
    "nested_compile_region": CallsARegionTwice,
    "nested_compile_region_and_a_constant": AddsAConstantToARegion,
}


class CompileUnderFakeModeTrackerTests(CompileUnderFakeModeTestCase):
    # Every tracker around every compiled form, first call under the tracker
    # or before it: nothing fails inside Dynamo, fullgraph=True holds, and the
    # tracker reports the same figures on every call. Trackers that only
    # observe see the compiled run in eager's rows: FlopCounterMode's table
    # (every module, forward and backward, every op) is eager's (nothing is
    # recomputed here); MemTracker's modules, their parameters and buffers,
    # and its peak parameters, buffers, gradients and optimizer state are
    # eager's (inside torch.compile(module) too, where stock's ModTracker
    # sees no module). Calls shown to trackers compile on entries of their
    # own. CommDebugMode, whose module tracker installs a global backward
    # hook, sees the frames run eagerly, as on stock.
    @parametrize("tracker", ["FlopCounterMode", "MemTracker", "CommDebugMode"])
    @parametrize("form", FORMS)
    @parametrize("first_call", ["under the tracker", "before it"])
    def test_trackers_around_compiled_forms(self, tracker, form, first_call):
        mode = FakeTensorMode()
        with mode:
            x = torch.randn(4, 16, requires_grad=True)
            eager_model = Net()
            eager_fn = compiled(form, eager_model, "inductor", fullgraph=True)
            with torch.compiler.set_stance("force_eager"):
                eager = tracked(tracker, eager_model, train_step(eager_model, eager_fn, x))
            if (
                tracker == "MemTracker"
                and not eager["modules"]
                and TRACKERS_SEE_COMPILED_RUN
            ):
                # Stock's ModTracker sees no module inside torch.compile(module)
                # (from 2.11); shown the compiled run, it sees the model's rows.
                eager = tracked(tracker, eager_model, train_step(eager_model, eager_model, x))
            model = Net()
            cnt = CompileCounterWithBackend("inductor")
            fn = compiled(form, model, cnt, fullgraph=True)
            if first_call == "before it":
                fn(x).sum().backward()
            reports = [tracked(tracker, model, train_step(model, fn, x)) for _ in range(2)]
            out = fn(x)
            ref = eager_model(x)
        self.assertEqual(reports[0], reports[1])
        self.assertEqual(reports[0], eager)
        if tracker == "FlopCounterMode":
            self.assertIn("Net.blocks.0.up" if "module" not in form else "OptimizedModule._orig_mod.blocks.0.up", reports[0])
        if tracker != "CommDebugMode" and TRACKERS_SEE_COMPILED_RUN:
            # One entry for the calls shown to the tracker, one for the others
            # (the blocks share theirs).
            self.assertEqual(cnt.frame_count, 2)
        self.assertOwnedLikeEager(out, ref, mode)

    @needs_trackers_patch
    @parametrize("case", ["eager", "aot_eager", "aot_eager, a graph break in each block"])
    def test_eagers_rows_on_every_backend(self, case):
        # The compiled run's figures in eager's rows with the backends that
        # run Dynamo's graph op by op (backward through eager's autograd) and
        # AOTAutograd's graphs, and with graph breaks inside the modules (the
        # frames after a break compile apart).
        backend, _, graph_break = case.partition(", ")
        # Dynamo's default (its test case turns nested graph breaks on).
        nested = {"nested_graph_breaks": False} if hasattr(torch._dynamo.config, "nested_graph_breaks") else {}
        with FakeTensorMode(), torch._dynamo.config.patch(**nested):
            x = torch.randn(4, 16, requires_grad=True)
            for tracker in ("FlopCounterMode", "MemTracker"):
                eager_model = Net(breaks=bool(graph_break))
                eager = tracked(tracker, eager_model, train_step(eager_model, eager_model, x))
                model = Net(breaks=bool(graph_break))
                fn = compiled("torch.compile(fn)", model, backend, fullgraph=not graph_break)
                self.assertEqual(tracked(tracker, model, train_step(model, fn, x)), eager)

    @needs_trackers_patch
    def test_compiled_modules_own_hooks_run_as_in_a_real_call(self):
        # Module.compile() under a tracker: the module's own hooks run as in
        # a real compiled call (a pre-hook with kwargs may replace the inputs,
        # a forward hook the output), and so many frames compile; the modules
        # inside are attributed.
        def run(fake):
            calls = []

            def pre_hook(module, args, kwargs):
                calls.append("pre")
                return (args[0][:2],), kwargs

            def hook(module, args, output):
                calls.append("post")
                return output.sum(-1)

            torch._dynamo.reset()
            with FakeTensorMode() if fake else contextlib.nullcontext():
                model = MLP()
                model.register_forward_pre_hook(pre_hook, with_kwargs=True)
                model.register_forward_hook(hook)
                cnt = CompileCounterWithBackend("aot_eager")
                model.compile(backend=cnt)
                x = torch.randn(4, 16)
                with FlopCounterMode(display=False) if fake else contextlib.nullcontext() as counter:
                    out = model(x)
            return calls, out.shape, cnt.frame_count, counter

        calls, shape, frames, counter = run(fake=True)
        self.assertEqual((calls, shape, frames), run(fake=False)[:3])
        self.assertEqual(calls, ["pre", "post"])
        self.assertEqual(set(counter.get_flop_counts()), {"Global", "MLP", "MLP.up", "MLP.down"})

    @needs_trackers_patch
    def test_builtin_module_compiled_in_place_is_attributed(self):
        # Dynamo skips nn.Linear's own frames: Module.compile() compiles its
        # call through a wrapper frame; the module is still attributed.
        with FakeTensorMode():
            model = torch.nn.Linear(16, 16)
            model.compile(backend="aot_eager")
            with FlopCounterMode(display=False) as counter:
                model(torch.randn(4, 16)).sum().backward()
        self.assertEqual(set(counter.get_flop_counts()), {"Global", "Linear"})

    @needs_trackers_patch
    @parametrize("backend", ["aot_eager", "inductor"])
    def test_compiled_builtin_container_is_entered_once(self, backend):
        # Dynamo traces the call of a module whose frames it skips
        # (nn.Sequential): its graphs name the module that the compiled call
        # entered already, as its hooks do in eager. MemTracker refuses a
        # module entered twice.
        with FakeTensorMode():
            x = torch.randn(4, 16, requires_grad=True)
            eager_model, model = (torch.nn.Sequential(MLP(), MLP()) for _ in range(2))
            eager = tracked("MemTracker", eager_model, train_step(eager_model, eager_model, x))
            fn = torch.compile(model, backend=backend)
            self.assertEqual(tracked("MemTracker", model, train_step(model, fn, x)), eager)

    @needs_trackers_patch
    @parametrize("device", ["cpu", "cuda"])
    def test_addcmul_with_a_python_scalar_under_mem_tracker(self, device):
        # Dynamo writes addcmul_(..., value=) as prims.fma with a Python
        # scalar; graphs shown to trackers run the prim's kernel, on fake
        # tensors of any device (cuda without a GPU too).
        from torch.distributed._tools.mem_tracker import MemTracker

        class AddCMul(torch.nn.Module):
            def forward(self, x, y):
                z = x * 1
                z.addcmul_(y, y, value=2.0)
                return z

        if device == "cuda" and not torch.backends.cuda.is_built():
            self.skipTest("a CPU-only build of torch aborts on fake cuda tensors, in eager too")
        with FakeTensorMode(), torch.device(device):
            x, y = torch.randn(8), torch.randn(8)
            model = torch.nn.Sequential(torch.nn.Linear(8, 8), AddCMul())
            compiled = torch.compile(lambda x, y: model[1](model[0](x), y), backend="eager")
            compiled(x, y)
            with torch.no_grad(), MemTracker():
                out = compiled(x, y)
        self.assertIsInstance(out, FakeTensor)
        self.assertEqual(out.device.type, device)

    @needs_trackers_patch
    def test_hooks_removed_during_the_call_stay_removed(self):
        # A hook that removes itself when it fires (as a lazy module's
        # initialization hook does) fires once, and never again in later
        # real calls.
        calls = []
        model = MLP()

        def once(module, args, output):
            calls.append(len(calls))
            handle.remove()

        handle = model.register_forward_hook(once)
        global_handle = torch.nn.modules.module.register_module_forward_hook(
            lambda module, args, output: global_handle.remove()
        )
        model.compile(backend="aot_eager")
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            with FlopCounterMode(display=False):
                model(mode.from_tensor(torch.randn(4, 16)))
        model(torch.randn(4, 16))
        self.assertEqual(calls, [0])
        self.assertFalse(model._forward_hooks)
        self.assertFalse(torch.nn.modules.module._global_forward_hooks)

    @needs_trackers_patch
    def test_a_tracker_subclass_that_may_change_results_runs_eagerly(self):
        # The declaration belongs to the class that implements
        # __torch_dispatch__: a subclass overriding it declares it again.
        from torch.distributed._tools.mem_tracker import MemTracker

        class HalfMatmulTracker(MemTracker):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = super().__torch_dispatch__(func, types, args, kwargs)
                if func is torch.ops.aten.mm.default:
                    out = out.to(torch.float16)
                return out

        cnt = CompileCounterWithBackend("aot_eager")
        with FakeTensorMode():
            a = torch.randn(4, 4)
            with HalfMatmulTracker():
                out = torch.compile(lambda a: (a @ a).sum(-1), backend=cnt)(a)
        self.assertEqual(cnt.frame_count, 0)
        self.assertEqual(out.dtype, torch.float16)

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_flop_counter_inside_a_region_that_mutates_a_buffer(self, backend):
        # Without grad, the graph calls auto_functionalized_v2 of an
        # invoke_subgraph: the inner higher-order op reaches the tracker's
        # forwarding mode, which runs it through its kernel too.
        with torch.no_grad():
            try:
                torch.compile(MutatesInARegion(), backend=backend)(torch.randn(4, 8))
            except (
                # torch 2.8 cannot trace a mutation inside a region, and
                # torch 2.13 cannot functionalize the op inside one
                torch._dynamo.exc.UncapturedHigherOrderOpError,
                torch._dynamo.exc.BackendCompilerFailed,
            ) as e:
                self.skipTest(f"a real compile of the model fails: {e}")
            torch._dynamo.reset()
        with FakeTensorMode(), torch.no_grad():
            model = MutatesInARegion()
            x = torch.randn(4, 8)
            with FlopCounterMode(display=False) as eager:
                model(x)
            compiled_model = torch.compile(model, backend=backend)
            with FlopCounterMode(display=False) as counter:
                out = compiled_model(x)
        self.assertGreater(eager.get_total_flops(), 0)
        self.assertEqual(counter.get_total_flops(), eager.get_total_flops())
        self.assertEqual(out.shape, (4, 8))

    def test_a_global_forward_hook_of_the_user_runs_frames_eagerly(self):
        # A global forward hook that is not a module tracker's may change
        # results: it fires for every module it fires for in eager, as on
        # stock, nothing is compiled for the call, and a warning says why.
        seen = []

        def first_half(module, args, output):
            seen.append(type(module).__name__)
            if isinstance(module, torch.nn.Linear):
                return output[..., : output.shape[-1] // 2]

        handle = torch.nn.modules.module.register_module_forward_hook(first_half)
        self.addCleanup(handle.remove)
        cnt = CompileCounterWithBackend("aot_eager")
        with FakeTensorMode():
            model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
            x = torch.randn(2, 8)
            with FlopCounterMode(display=False):
                model(x)
            in_eager, seen[:] = list(seen), []
            model.compile(backend=cnt)
            with FlopCounterMode(display=False):
                if TRACKERS_SEE_COMPILED_RUN:
                    with self.assertWarnsRegex(UserWarning, "may change results"):
                        out = model(x)
                else:
                    out = model(x)
        self.assertEqual(out.shape, (2, 4))
        self.assertEqual(cnt.frame_count, 0)
        self.assertEqual(seen, in_eager)

    @needs_trackers_patch
    @parametrize("form", ["Module.compile()", "torch.compile(module)"])
    @parametrize("overlap", ["b's tracker inside a's call", "a's call inside b's tracker"])
    def test_two_threads_each_get_their_own_figures(self, form, overlap):
        # Two threads make fake calls under FlopCounterModes of their own,
        # overlapping: b enters its tracker, calls and leaves while a is
        # inside its call (its model's pre-hook waits), or a makes its whole
        # call while b's tracker is entered. Nothing process-wide changes
        # during a call, each table is eager's (the form's, force_eager), and
        # no hook stays registered.
        a_in_call, a_done, b_in, b_done = (threading.Event() for _ in range(4))
        modes = {name: FakeTensorMode() for name in "ab"}
        x = {}
        eager = {}
        for name in "ab":
            with modes[name]:
                x[name] = torch.randn(4, 16, requires_grad=True)
                model = Net()
                fn = compiled(form, model, "aot_eager", fullgraph=False)
                with torch.compiler.set_stance("force_eager"):
                    eager[name] = tracked("FlopCounterMode", model, train_step(model, fn, x[name]))
        results, errors = {}, []

        @torch._dynamo.disable
        def wait(module, args):
            a_in_call.set()
            if overlap == "b's tracker inside a's call":
                b_done.wait(timeout=30)

        def worker(name):
            try:
                with modes[name]:
                    model = Net()
                    fn = compiled(form, model, "aot_eager", fullgraph=False)
                    step = train_step(model, fn, x[name])
                    if name == "a":
                        model.register_forward_pre_hook(wait)
                        if overlap == "a's call inside b's tracker":
                            b_in.wait(timeout=30)
                        results[name] = tracked("FlopCounterMode", model, step)
                        return
                    if overlap == "b's tracker inside a's call":
                        a_in_call.wait(timeout=30)
                        results[name] = tracked("FlopCounterMode", model, step)
                        return

                    def step_after_a():
                        b_in.set()
                        a_done.wait(timeout=30)
                        step()

                    results[name] = tracked("FlopCounterMode", model, step_after_a)
            except Exception as e:  # reported below
                errors.append(e)
            finally:
                (a_done if name == "a" else b_done).set()

        threads = [threading.Thread(target=worker, args=(name,)) for name in "ab"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        self.assertFalse(errors, [repr(e) for e in errors])
        self.assertEqual(results, eager)
        hooks = torch.nn.modules.module
        self.assertFalse(hooks._global_forward_pre_hooks)
        self.assertFalse(hooks._global_forward_hooks)

    @needs_trackers_patch
    def test_a_standalone_mod_tracker_with_callbacks_sees_eager(self):
        # A ModTracker whose user hooks are not a tracker's is called back
        # for modules only as they run eagerly: the frame runs eagerly, as on
        # stock, with a warning, and it sees every module.
        from torch.distributed._tools.mod_tracker import ModTracker

        with FakeTensorMode():
            model = Net()
            x = torch.randn(4, 16)
            fn = compiled("torch.compile(fn)", model, "aot_eager", fullgraph=False)
            seen = {}
            for label, call in (("eager", model), ("compiled", fn)):
                mod_tracker = ModTracker()
                names = seen[label] = []
                mod_tracker.register_user_hooks(
                    pre_fw_hook=lambda mod, inp: names.append(mod_tracker.get_known_fqn(mod))
                )
                with mod_tracker, FlopCounterMode(display=False):
                    if label == "compiled":
                        with self.assertWarnsRegex(UserWarning, "ModTracker calls back"):
                            call(x)
                    else:
                        call(x)
        self.assertEqual(seen["compiled"], seen["eager"])
        self.assertIn("Net.blocks.0.up", seen["eager"])

    @needs_trackers_patch
    def test_backward_under_a_tracker_that_saw_no_forward(self):
        # The backward graphs drive the trackers the forward graphs ran
        # under: a MemTracker entered for the backward only books no module,
        # as in eager (its module pre-hook never ran).
        from torch.distributed._tools.mem_tracker import MemTracker

        modules = {}
        with FakeTensorMode():
            x = torch.randn(4, 16, requires_grad=True)
            for label in ("eager", "compiled"):
                model = Net()
                fn = model if label == "eager" else torch.compile(model, backend="aot_eager")
                with FlopCounterMode(display=False):
                    out = fn(x)
                mem_tracker = MemTracker()
                with mem_tracker:
                    out.sum().backward()
                modules[label] = [s.mod_fqn for s in mem_tracker.memory_tracking.values()]
        self.assertEqual(modules["compiled"], modules["eager"])

    @parametrize("form", ["torch.compile(fn)", "Module.compile()"])
    def test_force_eager_stance_shows_trackers_eager(self, form):
        # set_stance("force_eager") gives eager's figures, every module included.
        with FakeTensorMode():
            model = MLP()
            x = torch.randn(4, 16)
            with FlopCounterMode(display=False) as eager:
                model(x)
            fn = compiled(form, model, "aot_eager", fullgraph=False)
            with torch.compiler.set_stance("force_eager"):
                with FlopCounterMode(display=False) as counter:
                    fn(x)
        self.assertEqual(set(counter.get_flop_counts()), set(eager.get_flop_counts()))
        self.assertIn("MLP.up", counter.get_flop_counts())

    @needs_trackers_patch
    @parametrize("backend", BACKENDS)
    def test_flop_counter_around_compiled_module(self, backend):
        # A Hugging Face-style model: FlopCounterMode around torch.compile(module)
        # gives eager's table, every module.
        with FakeTensorMode():
            model = MLP()
            x = torch.randn(4, 16)
            cnt = CompileCounterWithBackend(backend)
            fn = torch.compile(model, backend=cnt)
            with FlopCounterMode(display=False) as counter:
                fn(x).sum().backward()
            with torch.compiler.set_stance("force_eager"):
                with FlopCounterMode(display=False) as eager:
                    fn(x).sum().backward()
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(counter.get_flop_counts(), eager.get_flop_counts())
        self.assertIn("OptimizedModule._orig_mod.up", counter.get_flop_counts())

    @needs_trackers_patch
    @parametrize("backend", ["aot_eager", "inductor"])
    @parametrize("case", ["budget 0.1", "selective checkpoint"])
    def test_flop_counter_counts_the_compiled_graphs(self, backend, case):
        # At activation_memory_budget 0.1, and under a selective-checkpoint
        # policy that saves nothing, a matmul is recomputed in backward:
        # FlopCounterMode around a fake call counts the FLOPs
        # of the forward and backward graphs the backend builds for the real
        # run (counted here on the graphs a real Inductor compile is given),
        # in eager's rows, a recomputed matmul in its module's.
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        graph_flops = []

        def inner_compile(gm, example_inputs, **kwargs):
            fake_mode = torch._guards.detect_fake_mode(example_inputs)
            with fake_mode, FlopCounterMode(display=False) as counter:
                gm(*example_inputs)
            graph_flops.append(counter.get_total_flops())
            return compile_fx_inner(gm, example_inputs, **kwargs)

        def recording_inductor(gm, example_inputs):
            return compile_fx(gm, example_inputs, inner_compile=inner_compile)

        torch.manual_seed(0)
        layers = torch.nn.Sequential(
            torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64)
        )
        model = layers if case == "budget 0.1" else Checkpointed(layers)
        x = torch.randn(32, 64, requires_grad=True)
        with torch._functorch.config.patch(
            activation_memory_budget=0.1 if case == "budget 0.1" else 1.0,
            enable_autograd_cache=False,
        ):
            torch.compile(model, backend=recording_inductor)(x).sum().backward()
            self.assertEqual(len(graph_flops), 2)
            torch._dynamo.reset()
            with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                fake_x = mode.from_tensor(x.detach()).requires_grad_()
                compiled_model = torch.compile(model, backend=backend)
                with FlopCounterMode(display=False) as counter:
                    compiled_model(fake_x).sum().backward()
                with torch.compiler.set_stance("force_eager"):
                    with FlopCounterMode(display=False) as eager:
                        compiled_model(fake_x).sum().backward()
                with FlopCounterMode(display=False) as unrecomputed:
                    layers(fake_x).sum().backward()
        self.assertEqual(counter.get_total_flops(), sum(graph_flops))
        self.assertGreater(counter.get_total_flops(), unrecomputed.get_total_flops())
        self.assertEqual(set(counter.get_flop_counts()), set(eager.get_flop_counts()))
        prefix = "OptimizedModule._orig_mod." + ("" if case == "budget 0.1" else "layers.")
        addmm = torch.ops.aten.addmm
        # The backward needs the first layer's output (through tanh), not
        # the last one's.
        for i, times in ((0, 2), (2, 1)):
            self.assertEqual(
                counter.get_flop_counts()[f"{prefix}{i}"][addmm],
                unrecomputed.get_flop_counts()[f"Sequential.{i}"][addmm] * times,
            )

    @needs_trackers_patch
    @parametrize("backend", ["aot_eager", "inductor"])
    @parametrize("case", ["mlp_budget_0.5", "block"])
    def test_mem_tracker_sees_what_the_compiled_forward_saves(self, case, backend):
        # MemTracker around a fake call: the activations alive after the
        # forward are what the real compiled run saves for backward (but
        # parameters and inputs, which it books apart) and the output, checked
        # against a real compiled run on CPU; eager saves more.
        model, inputs, config, _ = make_case(case)
        with torch._functorch.config.patch(config):
            real, _ = saved_activations(model, inputs, backend)
            eager, _ = saved_activations(model, inputs, "eager")
            torch._dynamo.reset()
            with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                fake_inputs = [
                    mode.from_tensor(t.detach()).requires_grad_() for t in inputs
                ]
                activations, _ = mem_tracker_activations(
                    torch.compile(model, backend=backend), model, fake_inputs
                )
        self.assertEqual(activations, real)
        self.assertLess(real, eager)

    @needs_trackers_patch
    @parametrize("backend", ["aot_eager", "inductor"])
    @parametrize("case", list(HOP_CASES))
    def test_trackers_see_inside_ops_only_compiled_graphs_have(self, case, backend):
        # Compiled graphs call a mutating custom op through
        # auto_functionalized and a nested_compile_region through
        # invoke_subgraph, higher-order ops eager never calls and trackers
        # have no rule for (stock runs these frames eagerly). The trackers see
        # the ops inside: FlopCounterMode counts eager's matmuls (no
        # recomputation here), MemTracker's activations are what the real
        # compiled run saves.
        torch.manual_seed(0)
        model = HOP_CASES[case]()
        inputs = (torch.randn(4, 8, requires_grad=True),)
        real, out = saved_activations(model, inputs, backend)
        if not gradients_match_eager(model, inputs, out):
            # Inductor 2.15 writes the output of a pointwise op after a
            # region called twice into a buffer the forward saves for
            # backward: that run saves less and computes wrong gradients.
            self.skipTest(f"a real {backend} run computes wrong gradients")
        torch._dynamo.reset()
        with FakeTensorMode():
            # Built under the mode, as estimators do: MemTracker books its
            # parameters as parameters.
            model = HOP_CASES[case]()
            fake_x = torch.randn(4, 8, requires_grad=True)
            compiled_model = torch.compile(model, backend=backend)
            with FlopCounterMode(display=False) as counter:
                compiled_model(fake_x).sum().backward()
            with FlopCounterMode(display=False) as eager:
                model(fake_x).sum().backward()
            activations, out = mem_tracker_activations(compiled_model, model, [fake_x])
        self.assertGreater(eager.get_total_flops(), 0)
        self.assertEqual(counter.get_total_flops(), eager.get_total_flops())
        self.assertEqual(activations, real)
        self.assertEqual(out.shape, (4, 8))

    @needs_trackers_patch
    def test_fullgraph_under_a_mode_that_only_observes_compiles(self):
        cnt = CompileCounterWithBackend("eager")
        mode = FakeTensorMode()
        with mode:
            x = torch.randn(4, 4)
            with FlopCounterMode(display=False) as counter:
                out = torch.compile(
                    lambda x: (x @ x).relu(), backend=cnt, fullgraph=True
                )(x)
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(counter.get_total_flops(), 2 * 4 * 4 * 4)
        self.assertOwnedLikeEager(out, torch.empty_like(out), mode)

    def test_fullgraph_under_another_mode_runs_the_frame_eagerly(self):
        # A mode that does not declare it only observes keeps the frame
        # skipped, as on stock; fullgraph=True holds under the FakeTensorMode.
        class OpLog(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.ops = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.ops.append(func)
                return func(*args, **(kwargs or {}))

        cnt = CompileCounterWithBackend("eager")
        mode = FakeTensorMode()
        with mode:
            x = torch.randn(4, 4)
            with OpLog() as log:
                out = torch.compile(
                    lambda x: (x @ x).relu(), backend=cnt, fullgraph=True
                )(x)
        self.assertEqual(cnt.frame_count, 0)
        self.assertEqual(
            log.ops, [torch.ops.aten.mm.default, torch.ops.aten.relu.default]
        )
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
