# Owner(s): ["module: dynamo"]
"""
Regions (opt in with torch._dynamo.config.fake_mode_region_after_calls): an entry
compiled under a user-created FakeTensorMode and called that many times runs its
graph as one fake_mode_region call, one dispatch-cache hit per call in the steady
state. Symbolic graphs, entries with view or aliased outputs, calls autograd
records and functorch transforms stay op by op; a region that fails to compile is
logged and the calls still work; region cache entries go with the compiled
function. CompileUnderFakeModeRegionTests runs the tests of this file and of the
earlier patches' files (test_compile_under_fake_mode{,_guards,_backends,
_trackers,_optimizer}.py) again with regions from the first call.
See Note [Inheriting the ambient FakeTensorMode] in
torch/_dynamo/ambient_fake_mode.py
"""

import contextlib
import gc
from unittest import mock

import torch
import torch._dynamo.test_case
from torch._dynamo.utils import counters
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


# The other files of the Note are imported as modules: a test class imported by
# name would be collected again in this file.
try:
    from . import (
        test_compile_under_fake_mode,
        test_compile_under_fake_mode_backends,
        test_compile_under_fake_mode_guards,
        test_compile_under_fake_mode_trackers,
        test_compile_under_fake_mode_optimizer,
    )
    from .test_compile_under_fake_mode import (
        BACKENDS,
        CompileUnderFakeModeTestCase,
        frames_compiled,
        meta_of,
        regions_compiled,
    )
except ImportError:
    import test_compile_under_fake_mode
    import test_compile_under_fake_mode_backends
    import test_compile_under_fake_mode_guards
    import test_compile_under_fake_mode_trackers
    import test_compile_under_fake_mode_optimizer
    from test_compile_under_fake_mode import (
        BACKENDS,
        CompileUnderFakeModeTestCase,
        frames_compiled,
        meta_of,
        regions_compiled,
    )


def region_cache_keys():
    # Dispatch-cache keys of fake_mode_region calls: they hold the region's
    # graph module type and id.
    return [
        key
        for key in FakeTensorMode.cache
        if any(
            isinstance(v, type) and issubclass(v, torch.fx.GraphModule) for v in key.key
        )
    ]


class CompileUnderFakeModeRegionTieringTests(CompileUnderFakeModeTestCase):
    def setUp(self):
        super().setUp()
        # Regions are opt-in: the first call runs op by op, the later ones
        # the regions, unless a test says otherwise.
        self._stack.enter_context(
            torch._dynamo.config.patch(fake_mode_region_after_calls=1)
        )

    # Regions replay the captured graph: they serve entries that run op by op
    # (backend aot_eager and inductor run their own graphs by default).
    def run_op_by_op(self):
        self._stack.enter_context(
            torch._dynamo.config.patch(fake_mode_runs_backend_graphs=False)
        )

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_entries_running_backend_graphs_build_no_region(self, backend):
        with torch._dynamo.config.patch(fake_mode_region_after_calls=0):
            fn = torch.compile(lambda x: x.sin().cos(), backend=backend)
            with FakeTensorMode():
                x = torch.randn(5, 2)
                for _ in range(3):
                    fn(x)
        self.assertEqual(frames_compiled(), 1)
        self.assertEqual(regions_compiled(), 0)

    @parametrize("no_grad", [False, True])
    def test_steady_state_is_one_cache_hit_per_call(self, no_grad):
        self.run_op_by_op()
        fn = torch.compile(lambda x: x.sin().cos().exp().sum(0), backend="inductor")
        mode = FakeTensorMode()
        ctx = torch.no_grad() if no_grad else contextlib.nullcontext()
        with mode, ctx:
            # Autograd records nothing: without requires_grad, or under no_grad.
            x = torch.randn(4, 3, requires_grad=no_grad)
            for _ in range(2):
                fn(x)
            self.assertEqual(regions_compiled(), 1)
            before = FakeTensorMode.cache_info()
            out = fn(x)
            after = FakeTensorMode.cache_info()
        self.assertOwnedLikeEager(out, x.sin().cos().exp().sum(0).detach(), mode)
        # The whole forward is one dispatch-cache hit, not one per op.
        self.assertEqual(after.hits - before.hits, 1)
        self.assertEqual(after.misses - before.misses, 0)

    @parametrize("backend", BACKENDS)
    def test_calls_autograd_records_stay_op_by_op(self, backend):
        self.run_op_by_op()
        # A region would be differentiable once, and its saved tensors would
        # not be eager's: past the regions' threshold, double backward and
        # saved-tensor hooks still see eager's behaviour.
        def fn(x, w):
            return (x @ w).tanh().sum()

        def run(f, x, w):
            saved = []

            def pack(t):
                saved.append(meta_of(t)[1:5])
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = f(x, w)
            (gx,) = torch.autograd.grad(loss, x, create_graph=True)
            gx.sum().backward()
            return saved, meta_of(gx), meta_of(w.grad)

        mode = FakeTensorMode()
        compiled = torch.compile(fn, backend=backend)
        with torch._dynamo.config.patch(fake_mode_region_after_calls=16), mode:
            x = torch.randn(4, 3, requires_grad=True)
            w = torch.randn(3, 5, requires_grad=True)
            ref = run(fn, x, w)
            for _ in range(18):
                w.grad = None
                self.assertEqual(run(compiled, x, w), ref)
        self.assertEqual(regions_compiled(), 0)

    def test_outputs_aliasing_each_other_stay_views(self):
        self.run_op_by_op()
        # The dispatch cache would replay such outputs as unrelated tensors.
        def fn(x):
            return (x * 2).split(2)

        def views(out):
            return [
                (o.storage_offset(), o._is_view(), o.untyped_storage()._cdata)
                for o in out
            ]

        compiled = torch.compile(fn, backend="inductor")
        with torch._dynamo.config.patch(fake_mode_region_after_calls=16):
            with FakeTensorMode(), torch.no_grad():
                x = torch.randn(6, 4)
                for _ in range(18):
                    out, ref = compiled(x), fn(x)
                    self.assertEqual(
                        [v[:2] for v in views(out)], [v[:2] for v in views(ref)]
                    )
                    self.assertEqual(len({v[2] for v in views(out)}), 1)
        self.assertEqual(regions_compiled(), 0)

    def test_functorch_transforms_stay_op_by_op(self):
        self.run_op_by_op()
        fn = torch.compile(lambda x: (x.sin() * 2).sum(), backend="inductor")
        with torch._dynamo.config.patch(fake_mode_region_after_calls=1):
            with FakeTensorMode() as mode:
                x = torch.randn(3, 4)
                for _ in range(3):
                    out = torch.func.vmap(fn)(x)
                    self.assertOwnedLikeEager(
                        out, torch.func.vmap(lambda x: (x.sin() * 2).sum())(x), mode
                    )
                    grad = torch.func.grad(fn)(x)
                    self.assertOwnedLikeEager(grad, (x.cos() * 2), mode)
                    # A compiled call on an unbatched, closed-over input
                    # inside vmap: its arguments are plain FakeTensors.
                    out = torch.func.vmap(lambda y: fn(x[0]) * y)(x)
                    self.assertOwnedLikeEager(
                        out,
                        torch.func.vmap(lambda y: (x[0].sin() * 2).sum() * y)(x),
                        mode,
                    )
        self.assertEqual(counters["fake_mode"]["regions_failed"], 0)

    def test_view_outputs_keep_eager_metadata(self):
        self.run_op_by_op()
        # A replayed region's outputs are fresh tensors: an entry whose outputs
        # are views of intermediates keeps running op by op.
        def fn(x):
            y = x + 1
            return y[1:], y.t(), y[:, :2], y.expand(2, 4, 3), y.diagonal(), y[None]

        compiled = torch.compile(fn, backend="inductor")
        with torch._dynamo.config.patch(fake_mode_region_after_calls=0):
            with FakeTensorMode() as mode, torch.no_grad():
                x = torch.randn(4, 3)
                for _ in range(3):
                    self.assertOwnedLikeEager(compiled(x), fn(x), mode)
        self.assertEqual(regions_compiled(), 0)

    # A replayed output has version counter 0: an entry whose output was
    # written in place keeps running op by op, as eager counts that write.
    def test_outputs_written_in_place_keep_eager_versions(self):
        self.run_op_by_op()
        def fn(x):
            return x.new_empty_strided(x.shape, x.stride()).fill_(2), (x + 1).mul_(3)

        compiled = torch.compile(fn, backend="inductor")
        with torch._dynamo.config.patch(fake_mode_region_after_calls=0):
            with FakeTensorMode() as mode, torch.no_grad():
                x = torch.randn(4, 3)
                for _ in range(3):
                    outs, refs = compiled(x), fn(x)
                    for out, ref in zip(outs, refs):
                        self.assertOwnedLikeEager(out, ref, mode)
                        self.assertEqual(out._version, ref._version)
        self.assertEqual(regions_compiled(), 0)

    # Tiering: the first calls run op by op, a hot entry gets regions.
    @parametrize("backend", BACKENDS)
    def test_first_calls_op_by_op_then_regions(self, backend):
        self.run_op_by_op()
        def fn(x):
            return x.sin().cos().exp().sum(0)

        after = 2
        compiled = torch.compile(fn, backend=backend)
        mode = FakeTensorMode()
        with mode:
            x = torch.randn(4, 3)
        ops = []
        dispatch = mode._cached_dispatch_impl

        def recording_dispatch(func, *args, **kwargs):
            ops[-1].append(func.name())
            return dispatch(func, *args, **kwargs)

        with torch._dynamo.config.patch(fake_mode_region_after_calls=after), mode:
            with mock.patch.object(mode, "_cached_dispatch_impl", recording_dispatch):
                for _ in range(after + 2):
                    ops.append([])
                    out = compiled(x)
            self.assertOwnedLikeEager(out, fn(x), mode)
        eager = ["aten::sin", "aten::cos", "aten::exp", "aten::sum.dim_IntList"]
        # Op by op, as eager; then the regions are compiled, and the first
        # run of the region runs its ops; from then on one op per call.
        self.assertEqual(ops[:after], [eager] * after)
        self.assertEqual(ops[after], ["fake_mode_region", *eager])
        self.assertEqual(ops[after + 1], ["fake_mode_region"])
        self.assertEqual(regions_compiled(), 1)
        self.assertEqual(frames_compiled(), 1)

    @parametrize("backend", BACKENDS)
    def test_regions_are_opt_in(self, backend):
        self.run_op_by_op()
        # The shipped default builds no region however often an entry is
        # called: every call runs op by op, as the eager backend would.
        self.assertIsNone(self.shipped_region_after_calls)

        def fn(x):
            return x.sin().cos().exp().sum(0)

        compiled = torch.compile(fn, backend=backend)
        mode = FakeTensorMode()
        with mode:
            x = torch.randn(4, 3)
        with torch._dynamo.config.patch(fake_mode_region_after_calls=None), mode:
            with torch.no_grad():
                for _ in range(20):
                    out = compiled(x)
            self.assertOwnedLikeEager(out, fn(x), mode)
        self.assertEqual(regions_compiled(), 0)
        self.assertEqual(frames_compiled(), 1)

    def test_regions_of_symbolic_graphs_are_not_compiled(self):
        self.run_op_by_op()
        fn = torch.compile(lambda x: x * 2, backend="eager", dynamic=True)
        with torch._dynamo.config.patch(fake_mode_region_after_calls=0):
            for n in (3, 4, 5):
                with FakeTensorMode():
                    fn(torch.randn(n))
        self.assertEqual(regions_compiled(), 0)

    def test_region_failure_is_logged_and_calls_still_work(self):
        self.run_op_by_op()
        def failing_aot_autograd(**kwargs):
            raise RuntimeError("boom")

        mode = FakeTensorMode()
        fn = torch.compile(lambda x: x.sin() + 1, backend="eager")
        with (
            torch._dynamo.config.patch(fake_mode_region_after_calls=0),
            mock.patch(
                "torch._dynamo.backends.common.aot_autograd", failing_aot_autograd
            ),
        ):
            with self.assertLogs(
                "torch._dynamo.fake_mode_regions", "WARNING"
            ) as logs:
                with mode:
                    x = torch.randn(3)
                    for _ in range(3):
                        self.assertOwnedLikeEager(fn(x), x.sin() + 1, mode)
        self.assertIn("boom", "\n".join(logs.output))
        self.assertEqual(len(logs.records), 1)
        self.assertEqual(counters["fake_mode"]["regions_failed"], 1)
        counters["fake_mode"]["regions_failed"] = 0

    # Memory: regions go with the compiled function.
    def test_region_cache_entries_go_with_the_compiled_function(self):
        self.run_op_by_op()
        # Only this test's keys: before torch 2.14, reset() keeps the dispatch
        # cache, and an earlier test's regions may still be alive.
        before = set(region_cache_keys())
        with torch._dynamo.config.patch(fake_mode_region_after_calls=0):
            fn = torch.compile(lambda x: x.sin().cos(), backend="inductor")
            with FakeTensorMode():
                x = torch.randn(5, 2)
                fn(x)
                fn(x)
        self.assertEqual(regions_compiled(), 1)
        self.assertGreater(len(set(region_cache_keys()) - before), 0)
        del fn
        # Not reset(): since torch 2.14 it also clears the whole dispatch cache.
        torch._dynamo.reset_code_caches()
        gc.collect()
        self.assertEqual(set(region_cache_keys()) - before, set())


instantiate_parametrized_tests(CompileUnderFakeModeRegionTieringTests)


class CompileUnderFakeModeRegionTests(
    test_compile_under_fake_mode.CompileUnderFakeModeTests,
    test_compile_under_fake_mode_guards.CompileUnderFakeModeGuardTests,
    test_compile_under_fake_mode_backends.CompileUnderFakeModeBackendTests,
    test_compile_under_fake_mode_trackers.CompileUnderFakeModeTrackerTests,
    test_compile_under_fake_mode_optimizer.CompileUnderFakeModeOptimizerTests,
    CompileUnderFakeModeRegionTieringTests,
):
    """The same contract when the first call already runs the regions."""

    def setUp(self):
        super().setUp()
        self._stack.enter_context(
            torch._dynamo.config.patch(fake_mode_region_after_calls=0)
        )


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
