# Owner(s): ["module: dynamo"]
"""
Guards of functions compiled under a user-created FakeTensorMode: real and fake
calls never share a cache entry (an entry compiled for fake calls holds a
FAKE_TENSOR_MODE guard; real calls look up entries of their own), guard filters
never serve fake calls real code, and the guards of entries compiled for real
calls are unchanged.
See Note [Inheriting the ambient FakeTensorMode] in
torch/_dynamo/ambient_fake_mode.py
"""

import unittest
import unittest.mock

import numpy as np

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


try:
    from .test_compile_under_fake_mode import (
        BACKENDS,
        CompileUnderFakeModeTestCase,
        frames_compiled,
        HAS_PRECOMPILE_PACKAGE,
    )
except ImportError:
    from test_compile_under_fake_mode import (
        BACKENDS,
        CompileUnderFakeModeTestCase,
        frames_compiled,
        HAS_PRECOMPILE_PACKAGE,
    )


class CompileUnderFakeModeGuardTests(CompileUnderFakeModeTestCase):
    def assertFakeCallLikeEager(self, fn, *shape):
        """fn (x * 2 + 1, compiled) called under a new FakeTensorMode on a
        FakeTensor of that shape answers as eager does."""
        with FakeTensorMode() as mode:
            fake = torch.randn(shape)
            self.assertOwnedLikeEager(fn(fake), fake * 2 + 1, mode)

    # Real and fake calls never share an artifact wrongly.
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

    # Run-only lookups (the eager_on_recompile stance, torch._dynamo.run)
    # match entries of every backend: a fake call's match only the entries
    # compiled for fake calls, so it never gets a real entry without tensor
    # inputs (review: that gave a real tensor under the mode).
    def test_run_only_lookups_never_give_fake_calls_a_real_entry(self):
        def f():
            return torch.ones(3) * 2

        fn = torch.compile(f, backend="inductor")
        self.assertNotIsInstance(fn(), FakeTensor)
        with torch.compiler.set_stance("eager_on_recompile"):
            with FakeTensorMode() as mode:
                out = fn()
        self.assertIs(out.fake_mode, mode)
        with FakeTensorMode() as mode:
            out = torch._dynamo.run(f)()
        self.assertIs(out.fake_mode, mode)
        self.assertEqual(frames_compiled(), 1)
        # An entry compiled for fake calls serves a run-only fake call, and
        # never a run-only real one.
        with FakeTensorMode() as mode:
            fn()
        self.assertEqual(frames_compiled(), 2)
        with torch.compiler.set_stance("eager_on_recompile"):
            with FakeTensorMode() as mode:
                self.assertIs(fn().fake_mode, mode)
            self.assertEqual(torch._dynamo.run(f)(), torch.full((3,), 2.0))
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

    # Guards.
    @unittest.skipUnless(
        HAS_PRECOMPILE_PACKAGE, "torch._dynamo.precompile_package was added in 2.15"
    )
    def test_fake_tensor_mode_guard_is_classified_for_precompile(self):
        from torch._dynamo import precompile_package

        classified = [
            name
            for name in dir(precompile_package)
            if name.endswith("_GUARD_TYPES")
            and "FAKE_TENSOR_MODE" in getattr(precompile_package, name)
        ]
        self.assertEqual(classified, ["_UNMODELLED_GUARD_TYPES"])

    # Real and fake calls look up entries of their own (the callback of a
    # call under a FakeTensorMode keys its entries by a backend of its own),
    # so a guard filter that drops every guard never serves a fake call real
    # code, and the real entry stays without guards.
    @parametrize("first", ["real", "fake"])
    @parametrize("backend", BACKENDS)
    def test_skip_all_guards_unsafe_never_serves_fake_calls_real_code(
        self, backend, first
    ):
        def skip_all_guards_unsafe(guard_entries):
            # torch.compiler.skip_all_guards_unsafe, which older releases lack
            return [False] * len(guard_entries)

        def f(x):
            return x * 2 + 1

        fn = torch.compile(
            f, backend=backend, options={"guard_filter_fn": skip_all_guards_unsafe}
        )
        real = torch.randn(4)
        mode = FakeTensorMode()
        for kind in [first, "fake" if first == "real" else "real"] * 2:
            if kind == "real":
                self.assertEqual(fn(real), real * 2 + 1)
            else:
                with mode:
                    fake = torch.randn(4)
                    self.assertOwnedLikeEager(fn(fake), fake * 2 + 1, mode)
        self.assertEqual(frames_compiled(), 2)
        entries = torch._dynamo.eval_frame._debug_get_cache_entry_list(f)
        self.assertEqual(len(entries), 2)
        # The real entry holds no guard on the inputs or the fake mode: the
        # filter dropped them. (Releases before 2.10 keep two global-state
        # guards regardless.)
        (real_entry,) = [
            e
            for e in entries
            if not getattr(e.guard_manager, "compiled_for_fake_calls", False)
        ]
        root = real_entry.guard_manager.root
        self.assertEqual(len(root.get_accessors()), 0)
        self.assertNotIn(
            "LAMBDA_GUARD", [type(guard).__name__ for guard in root.get_leaf_guards()]
        )
        if backend == "inductor":
            self.assertEqual(self.inductor_compiles, 1)

    # FakeTensors called outside their mode under a guard filter: only their
    # type tells them apart, and an entry compiled for them has Inductor
    # compile the graph on its first real call.
    def test_guard_filter_fake_tensors_outside_a_mode_first(self):
        def skip_all_guards_unsafe(guard_entries):
            return [False] * len(guard_entries)

        fn = torch.compile(
            lambda x: x * 2 + 1,
            backend="inductor",
            options={"guard_filter_fn": skip_all_guards_unsafe},
        )
        mode = FakeTensorMode()
        with mode:
            fake = torch.randn(4)
        real = torch.randn(4)
        for kind in ["fake", "real"] * 2:
            if kind == "real":
                self.assertEqual(fn(real), real * 2 + 1)
            else:
                self.assertOwnedLikeEager(fn(fake), fake * 2 + 1, mode)
        self.assertEqual(frames_compiled(), 1)
        self.assertEqual(self.inductor_compiles, 1)

    # Under a guard filter, a fake call predicts the compiled run whichever
    # kind of call came first (Inductor's partitioner recomputes the
    # pointwise ops, so the forward saves only its input), and real calls run
    # Inductor's code.
    @parametrize("first", ["real", "fake"])
    def test_guard_filter_each_kind_of_call_predicts_the_compiled_run(self, first):
        def skip_all_guards_unsafe(guard_entries):
            return [False] * len(guard_entries)

        def f(x):
            return x.sin().cos().sin()

        fn = torch.compile(
            f, backend="inductor", options={"guard_filter_fn": skip_all_guards_unsafe}
        )

        def saved_by_forward(fn, x):
            saved = []
            with torch.autograd.graph.saved_tensors_hooks(
                lambda t: saved.append(t) or t, lambda t: t
            ):
                out = fn(x)
            out.sum().backward()
            return len(saved)

        self.assertEqual(saved_by_forward(f, torch.randn(8, requires_grad=True)), 3)
        mode = FakeTensorMode()
        for kind in [first, "fake" if first == "real" else "real"] * 2:
            if kind == "real":
                x = torch.randn(8, requires_grad=True)
                self.assertEqual(saved_by_forward(fn, x), 1)
                self.assertEqual(x.grad, (x.sin().cos().cos() * -x.sin().sin() * x.cos()))
                continue
            with mode:
                x = torch.randn(8, requires_grad=True)
                self.assertEqual(saved_by_forward(fn, x), 1)
            self.assertIs(x.grad.fake_mode, mode)
        self.assertEqual(frames_compiled(), 2)
        self.assertEqual(self.inductor_compiles, 2)  # forward and backward

    # Real tensors passed under a FakeTensorMode(allow_non_fake_inputs=True)
    # make a fake call, as in eager: the real entry compiled first for the
    # same inputs never serves it.
    @parametrize("backend", BACKENDS)
    def test_real_inputs_under_allow_non_fake_inputs_after_a_real_call(self, backend):
        fn = torch.compile(lambda x: x.sin() * 2, backend=backend)
        real = torch.randn(4)
        self.assertEqual(fn(real), real.sin() * 2)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            out, ref = fn(real), real.sin() * 2
        self.assertOwnedLikeEager(out, ref, mode)
        self.assertEqual(fn(real), real.sin() * 2)
        self.assertEqual(frames_compiled(), 2)

    # Fake entries are keyed by the backend as Dynamo keys real ones: two
    # torch.compile calls with equal backends share them, and the key neither
    # keeps the user's backend alive nor writes on it.
    def test_fake_entries_share_equal_backends_and_let_them_go(self):
        import gc
        import weakref

        def f(x):
            return x * 2 + 1

        mode = FakeTensorMode()
        with mode:
            fake = torch.randn(4)
            for _ in range(2):
                fn = torch.compile(f, backend="inductor")
                self.assertOwnedLikeEager(fn(fake), fake * 2 + 1, mode)
        self.assertEqual(frames_compiled(), 1)

        class Owner:
            def backend(self, gm, example_inputs):
                return gm.forward

        owner = Owner()
        fn = torch._dynamo.optimize(owner.backend)(lambda x: x - 1)
        with mode:
            self.assertOwnedLikeEager(fn(fake), fake - 1, mode)
        self.assertEqual(vars(owner), {})
        alive = weakref.ref(owner)
        del owner, fn
        torch._dynamo.reset()
        gc.collect()
        self.assertIsNone(alive())

    @parametrize("backend", BACKENDS)
    def test_real_entries_guards_unchanged(self, backend):
        def guards_of(fn, *args):
            guards = []
            torch._dynamo.reset()
            torch._dynamo.optimize(backend, guard_export_fn=lambda g: guards.extend(g))(
                fn
            )(*args)
            return sorted(
                (str(g.originating_source.name), g.inner_create_fn().__name__)
                for g in guards
            )

        def fn(x, y):
            return (x @ y).relu() + 1

        # A function without tensor inputs too: only the fake mode tells its
        # real and fake calls apart, and real entries still get no guard.
        def no_tensor_input(n):
            return torch.ones(n) * 2

        for f, args in ((fn, (torch.randn(4, 4), torch.randn(4, 4))), (no_tensor_input, (3,))):
            on = guards_of(f, *args)
            with torch._dynamo.config.patch(inherit_ambient_fake_mode=False):
                off = guards_of(f, *args)
            self.assertEqual(on, off)
            self.assertNotIn("FAKE_TENSOR_MODE", {name for _, name in on})

    # A frame whose tensor is made from a NumPy array by Dynamo's guards
    # (___from_numpy): its same-frame guard check runs outside the user's mode,
    # as every guard's does, and FAKE_TENSOR_MODE sees the mode the frame was
    # called under.
    @parametrize("backend", BACKENDS)
    def test_numpy_function_under_fake_mode(self, backend):
        fn = torch.compile(lambda a: a * 2 + 1, backend=backend)
        mode = FakeTensorMode()
        for _ in range(2):
            with mode:
                out = fn(np.ones(3))
            self.assertIsInstance(out, FakeTensor)
            self.assertIs(out.fake_mode, mode)
            self.assertEqual((out.shape, out.dtype), (torch.Size([3]), torch.float64))
        # The real call that follows gets its own entry and NumPy's answer.
        self.assertEqual(fn(np.ones(3)).tolist(), [3.0, 3.0, 3.0])

    # A dry run under a FakeTensorMode never changes what later real calls do:
    # fake and real entries of a frame count toward their own recompile limits.
    @parametrize("backend", BACKENDS)
    def test_fake_entries_do_not_use_up_the_recompile_limit(self, backend):
        cnt = CompileCounterWithBackend(backend)
        fn = torch.compile(lambda x: x * 2 + 1, backend=cnt)
        with torch._dynamo.config.patch(recompile_limit=1):
            self.assertFakeCallLikeEager(fn, 3)
            real = torch.randn(3)
            self.assertEqual(fn(real), real * 2 + 1)
            # The real call compiled (no silent eager run), and its entry
            # serves the next real call.
            self.assertEqual(cnt.frame_count, 2)
            self.assertEqual(fn(real), real * 2 + 1)
            self.assertEqual(cnt.frame_count, 2)
            # A second fake shape is a recompilation of the fake entry, and
            # the limit applies to it as to real ones: it runs eagerly.
            self.assertFakeCallLikeEager(fn, 5, 5)
            self.assertEqual(cnt.frame_count, 2)
        if backend == "inductor":
            self.assertEqual(self.inductor_compiles, 1)

    # A fake call past its own recompile limit runs eagerly, and only that
    # call: the frame still compiles for the real calls that follow.
    @parametrize("backend", BACKENDS)
    def test_fake_calls_past_their_limit_leave_real_calls_compiling(self, backend):
        cnt = CompileCounterWithBackend(backend)
        fn = torch.compile(lambda x: x * 2 + 1, backend=cnt)
        with torch._dynamo.config.patch(recompile_limit=1):
            with FakeTensorMode() as mode:
                for shape in [(3,), (5, 5), (5, 5)]:
                    fake = torch.randn(shape)
                    self.assertOwnedLikeEager(fn(fake), fake * 2 + 1, mode)
            self.assertEqual(cnt.frame_count, 1)
            real = torch.randn(5, 5)
            self.assertEqual(fn(real), real * 2 + 1)
            self.assertEqual(cnt.frame_count, 2)
            # Fake calls at the new shape still run eagerly.
            self.assertFakeCallLikeEager(fn, 5, 5)
            self.assertEqual(cnt.frame_count, 2)
        # After a reset the frame compiles for fake calls again, also when a
        # real call compiles it first.
        torch._dynamo.reset()
        self.assertEqual(fn(real), real * 2 + 1)
        self.assertEqual(cnt.frame_count, 3)
        self.assertFakeCallLikeEager(fn, 5, 5)
        self.assertEqual(cnt.frame_count, 4)

    # An isolate_recompiles region's fake calls past their limit leave the
    # other regions' fake calls compiling (review: the mark was per code
    # object).
    @unittest.skipUnless(
        hasattr(torch._C._dynamo.eval_frame, "_get_cache_entries_for_region"),
        "isolate_recompiles regions are new in torch 2.13",
    )
    def test_fake_recompile_limit_is_per_isolate_recompiles_region(self):
        def f(x):
            return x * 2 + 1

        isolated = CompileCounterWithBackend("eager")
        default = CompileCounterWithBackend("eager")
        a = torch.compile(f, backend=isolated, isolate_recompiles=True)
        b = torch.compile(f, backend=default)
        with torch._dynamo.config.patch(
            recompile_limit=2, automatic_dynamic_shapes=False
        ), FakeTensorMode():
            b(torch.randn(9))
            for n in (2, 3, 4):
                a(torch.randn(n))
            self.assertEqual(isolated.frame_count, 2)
            b(torch.randn(10))
        self.assertEqual(default.frame_count, 2)

    # The recompilation reasons of a call are those of the entries of its own
    # kind: a real entry's guards passing for a fake call is no "unexpected
    # recompilation", and a fake entry's FakeTensor check is no reason for a
    # real one (review).
    def test_recompilation_reasons_are_of_the_calls_own_kind(self):
        from torch._dynamo import convert_frame

        reasons = []
        log_reasons = convert_frame.get_and_maybe_log_recompilation_reasons

        def record(*args, **kwargs):
            reasons.append(log_reasons(*args, **kwargs))
            return reasons[-1]

        fn = torch.compile(lambda x: x.sin(), backend="eager")
        with unittest.mock.patch.object(
            convert_frame, "get_and_maybe_log_recompilation_reasons", record
        ), torch._dynamo.config.patch(automatic_dynamic_shapes=False):
            fn(torch.randn(4))
            with FakeTensorMode():
                fn(torch.randn(4))
                fn(torch.randn(5))
            fn(torch.randn(6))
        fake_reasons, real_reasons = reasons
        self.assertEqual(len(fake_reasons), 1)
        self.assertIn("expected 4, actual 5", fake_reasons[0])
        self.assertEqual(len(real_reasons), 1)
        self.assertIn("expected 4, actual 6", real_reasons[0])
        # The fail_on_recompile stance gives them outside a compile, in its
        # error from torch 2.10 on.
        with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
            with FakeTensorMode(), torch.compiler.set_stance("fail_on_recompile"):
                with self.assertRaisesRegex(RuntimeError, "fail_on_recompile") as e:
                    fn(torch.randn(7))
        if "actual" in str(e.exception):
            self.assertIn("expected 5, actual 7", str(e.exception))
            self.assertNotIn("expected 6", str(e.exception))
        self.assertNotIn("FakeTensor", str(e.exception))

    # Automatic dynamic shapes: a dry run at another shape does not make the
    # next real compile dynamic; fake calls learn on their own, from what
    # real calls learned.
    def test_fake_calls_keep_their_own_automatic_dynamic_state(self):
        cnt = CompileCounterWithBackend("eager")
        fn = torch.compile(lambda x: x * 2 + 1, backend=cnt)

        def compiled_dynamic():
            return any(
                isinstance(node.meta.get("example_value"), torch.SymInt)
                for node in cnt.graphs[-1].graph.find_nodes(op="placeholder")
            )

        def dynamic_dims():
            (x,) = (
                node.meta["example_value"]
                for node in cnt.graphs[-1].graph.find_nodes(op="placeholder")
                if isinstance(node.meta.get("example_value"), torch.Tensor)
            )
            return [isinstance(size, torch.SymInt) for size in x.shape]

        with FakeTensorMode():
            fn(torch.randn(4))
        self.assertFalse(compiled_dynamic())
        real = torch.randn(8)
        self.assertEqual(fn(real), real * 2 + 1)
        self.assertEqual(cnt.frame_count, 2)
        self.assertFalse(compiled_dynamic())
        # A second fake shape: the fake calls' own recompilation is dynamic.
        self.assertFakeCallLikeEager(fn, 6)
        self.assertEqual(cnt.frame_count, 3)
        self.assertTrue(compiled_dynamic())
        # Real calls learn as without the dry runs: their second shape is.
        real = torch.randn(16)
        self.assertEqual(fn(real), real * 2 + 1)
        self.assertEqual(cnt.frame_count, 4)
        self.assertTrue(compiled_dynamic())
        # And fake calls learn what real calls learned, whenever they did: as
        # a real call at (4, 7) would, the fake one compiles both dims dynamic.
        torch._dynamo.reset()
        with FakeTensorMode():
            fn(torch.randn(4, 3))
        fn(torch.randn(8, 3))
        fn(torch.randn(8, 5))
        self.assertEqual(dynamic_dims(), [False, True])
        with FakeTensorMode():
            fn(torch.randn(4, 7))
        self.assertEqual(dynamic_dims(), [True, True])

    # A module with real parameters called with an int: no tensor input of the
    # frame tells a fake call from a real one, so both entries guard on the
    # fake mode, whichever came first.
    @parametrize("backend", BACKENDS)
    def test_real_params_int_input_fake_real_fake(self, backend):
        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)

            def forward(self, n):
                return self.lin(torch.ones(n, 4))

        model = Model()
        compiled = torch.compile(model, backend=backend)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        for _ in range(2):
            with mode:
                out, ref = compiled(3), model(3)
            self.assertOwnedLikeEager(out, ref, mode)
            self.assertEqual(compiled(3), model(3))
        self.assertEqual(frames_compiled(), 2)

    # Calls on FakeTensors made outside any mode count toward the recompile
    # limit with real calls, as on stock, however deep the FakeTensors sit.
    def test_fake_tensors_outside_a_mode_count_toward_the_limit(self):
        cnt = CompileCounterWithBackend("eager")
        fn = torch.compile(lambda xs: xs[0][0] * 2, backend=cnt, dynamic=False)
        with FakeTensorMode():
            inputs = [torch.randn(n) for n in range(1, 8)]
        with torch._dynamo.config.patch(recompile_limit=2):
            for x in inputs:
                self.assertEqual(fn([[x]]).shape, x.shape)
        self.assertEqual(cnt.frame_count, 2)


instantiate_parametrized_tests(CompileUnderFakeModeGuardTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
