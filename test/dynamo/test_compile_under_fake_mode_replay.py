# Owner(s): ["module: dynamo"]
"""
A repeated fake call replays what the backend's graphs made (Replay in
torch/_dynamo/fake_mode_replay.py) instead of running them: the replayed
outputs must be what running the graphs gives. Property test: generated
programs of views (transpose, narrow, unfold, expand, as_strided, dtype views,
view_as_real / view_as_complex, reshape of non-contiguous tensors), in-place
ops, aliasing outputs, outputs that are inputs, mixed dtypes and requires_grad
mixes, under no_grad and grad mode, go through AOTAutograd with the compilers a
fake call uses (compile_unlowered); the first fake call runs the graphs, the
later ones (fresh inputs of the same metadata) are replayed where the record
proved itself, and every call must give the first one's outputs, saved tensors,
gradients and version counters, by metadata and by what aliases what.

Examples: 500 by default (HYPOTHESIS_PROFILE=ci), 5000 with
HYPOTHESIS_PROFILE=long, TORCH_FORK_OVERLAY_REPLAY_EXAMPLES=N to choose.
See Note [Replaying a graph's outputs from their metadata] in
torch/_dynamo/ambient_fake_mode.py
"""

import os

import torch
import torch._dynamo.test_case
from torch._dynamo.fake_mode_backend_graphs import compile_unlowered
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import aot_function
from torch._subclasses.fake_tensor import FakeTensorMode

from hypothesis import assume, example, given, HealthCheck, settings, strategies as st


EXAMPLES = int(
    os.environ.get("TORCH_FORK_OVERLAY_REPLAY_EXAMPLES")
    or (5000 if os.environ.get("HYPOTHESIS_PROFILE") == "long" else 500)
)

_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}


def _int_view(a):
    # A dtype view to the integer type of the same size (two int64 for complex128).
    if a.dtype == torch.complex128:
        return torch.view_as_real(a).view(torch.int64)
    return a.view(_INT_OF_SIZE[a.dtype.itemsize])


# Each op maps a tensor to a tensor; an op that does not apply to its operand
# raises in eager, and the example is discarded.
OPS = {
    "t": lambda a: a.transpose(0, -1),
    "narrow": lambda a: a.narrow(-1, a.shape[-1] // 2, (a.shape[-1] + 1) // 2),
    "unfold": lambda a: a.unfold(-1, 2, 1),
    "expand": lambda a: a.unsqueeze(0).expand(3, *a.shape),
    "as_strided": lambda a: a.as_strided((a.numel() // 2,), (2,), a.storage_offset()),
    "select": lambda a: a[1],
    "int_view": _int_view,
    "view_as_real": torch.view_as_real,
    "view_as_complex": lambda a: torch.view_as_complex(a.reshape(*a.shape[:-1], -1, 2)),
    "reshape": lambda a: a.reshape(-1),
    "contiguous": lambda a: a.contiguous(),
    "detach": lambda a: a.detach(),
    "mul": lambda a: a * 2,
    "exp": torch.exp,
    "sum": lambda a: a.sum(0, keepdim=True),
    "matmul": lambda a: a @ a.transpose(0, -1),
    "to_double": lambda a: a.double(),
    "to_complex": lambda a: a.to(torch.complex64),
    "add_": lambda a: a.add_(1),
    "clone_mul_": lambda a: a.clone().mul_(3),
    "t_": lambda a: a.t_(),
}

steps = st.lists(
    st.tuples(st.sampled_from(sorted(OPS)), st.integers(0, 63)), min_size=1, max_size=6
)
input_specs = st.lists(
    st.tuples(
        st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.complex64]),
        st.booleans(),  # requires_grad
        st.sampled_from(["new", "same as 0", "view of 0"]),
    ),
    min_size=1,
    max_size=3,
)


def make_program(program, outputs):
    def fn(*inputs):
        pool = list(inputs)
        for name, which in program:
            pool.append(OPS[name](pool[which % len(pool)]))
        return [pool[i % len(pool)] for i in outputs]

    return fn


def make_inputs(specs, shape, mode=None):
    """Fresh inputs of the same metadata and aliasing every time."""
    inputs = []
    for dtype, requires_grad, kind in specs:
        if kind == "same as 0" and inputs:
            inputs.append(inputs[0])
            continue
        if kind == "view of 0" and inputs and not inputs[0].requires_grad:
            inputs.append(inputs[0].transpose(0, -1))
            continue
        t = torch.randn(shape, dtype=dtype)
        inputs.append(t.requires_grad_(requires_grad and not inputs))
    return inputs


def describe(inputs, outputs, saved, grads, mode):
    """What a call made, by metadata and by what aliases what: outputs,
    tensors saved for backward, inputs' gradients and version counters."""
    known = {}
    storages = {}

    def place(t):
        return known.get(id(t))

    def tensor(t, name):
        if not isinstance(t, torch.Tensor):
            return ("value", t)
        if id(t) in known:
            return ("is", known[id(t)])
        known[id(t)] = name
        storage = storages.setdefault(t.untyped_storage()._cdata, name)
        base = t._base
        return (
            type(t),
            getattr(t, "fake_mode", mode) is mode,
            t.dtype,
            tuple(t.shape),
            t.stride(),
            t.storage_offset(),
            t.untyped_storage().nbytes(),
            t.device,
            t.layout,
            t.requires_grad,
            t.is_leaf,
            type(t.grad_fn).__name__,
            t.is_conj(),
            t.is_neg(),
            t._is_view(),
            None if base is None else (place(base) or "another tensor"),
            storage,
            t._version,
        )

    described = [tensor(t, ("input", i)) for i, t in enumerate(inputs)]
    described += [tensor(t, ("output", i)) for i, t in enumerate(outputs)]
    described += [tensor(t, ("saved", i)) for i, t in enumerate(saved)]
    described += [
        None if g is None else tensor(g, ("grad", i)) for i, g in enumerate(grads)
    ]
    described += [t._version for t in inputs]
    # Which tensors share a version counter: bump each in turn, see who moves.
    tensors = [t for t in (*inputs, *outputs, *saved, *grads) if isinstance(t, torch.Tensor)]
    for t in tensors:
        before = [u._version for u in tensors]
        torch.autograd.graph.increment_version(t)
        described.append(
            [i for i, u in enumerate(tensors) if u._version != before[i]]
        )
    return described


def call(compiled, specs, shape, grad):
    inputs = make_inputs(specs, shape)
    saved = []
    with torch.set_grad_enabled(grad), torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t) or t, lambda t: t
    ):
        outputs = compiled(*inputs)
    differentiable = [
        o for o in outputs if isinstance(o, torch.Tensor) and o.grad_fn is not None
    ]
    leaves = [t for t in inputs if t.requires_grad]
    grads = []
    if differentiable and leaves:
        grads = torch.autograd.grad(
            differentiable,
            leaves,
            [torch.ones_like(o) for o in differentiable],
            allow_unused=True,
        )
    return inputs, outputs, saved, list(grads)


class ReplayPropertyTests(torch._dynamo.test_case.TestCase):
    def test_replayed_calls_give_what_running_the_graphs_gives(self):
        replayed_examples = []

        @settings(
            max_examples=EXAMPLES,
            derandomize=os.environ.get("HYPOTHESIS_PROFILE") != "long",
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        @given(
            program=steps,
            outputs=st.lists(st.integers(0, 63), min_size=1, max_size=4),
            specs=input_specs,
            shape=st.tuples(st.integers(2, 4), st.integers(1, 3), st.sampled_from([2, 4])),
            grad=st.booleans(),
        )
        # Found by this test: an as_strided view of an intermediate came
        # back as a tensor that is no view.
        @example(
            program=[("add_", 0), ("to_complex", 0), ("add_", 0), ("add_", 0), ("as_strided", 2)],
            outputs=[5],
            specs=[(torch.float32, False, "new")],
            shape=(2, 1, 2),
            grad=False,
        )
        def check(program, outputs, specs, shape, grad):
            fn = make_program(program, outputs)
            # Only programs eager runs, and AOTAutograd compiles, on real tensors.
            try:
                call(fn, specs, shape, grad)
                compiled = aot_function(
                    fn, fw_compiler=compile_unlowered, bw_compiler=compile_unlowered
                )
                call(compiled, specs, shape, grad)
            except Exception:
                assume(False)
            counters.clear()
            with FakeTensorMode() as mode:
                # The first fake call runs the graphs; the later ones may replay.
                first = describe(*call(compiled, specs, shape, grad), mode)
                for _ in range(2):
                    again = describe(*call(compiled, specs, shape, grad), mode)
                    self.assertEqual(again, first)
            replayed_examples.append(counters["fake_mode"]["graphs_replayed"] > 0)

        check()
        # The property holds because replays happen, not because none did.
        self.assertGreater(sum(replayed_examples), len(replayed_examples) // 2)

    def test_inputs_on_storages_of_another_size(self):
        # Found in review: a record proven for inputs on a storage of one size
        # made a dtype view of a tangent on a larger one (view_as_complex of
        # the whole storage) and raised.
        def fn(z):
            return torch.view_as_real(z).clone()

        def grads(storages):
            compiled = aot_function(
                fn, fw_compiler=compile_unlowered, bw_compiler=compile_unlowered
            )
            seen = []
            for storage in storages:
                z = torch.randn(3, dtype=torch.complex64, requires_grad=True)
                tangent = torch.randn(storage)[:6].view(3, 2)
                # autograd.grad: .grad's AccumulateGrad steals or copies the
                # gradient by its reference count, not by what the graph made.
                (grad,) = torch.autograd.grad(compiled(z), z, tangent)
                seen.append(describe([tangent], [grad], [], [], mode))
            return seen

        with FakeTensorMode() as mode:
            replayed = grads([6, 6, 6, 7, 7])
            # A first call runs the graphs.
            ran = grads([6]) + grads([7])
        self.assertGreater(counters["fake_mode"]["graphs_replayed"], 0)
        self.assertEqual(replayed, [ran[0]] * 3 + [ran[1]] * 2)

    def test_outputs_sharing_a_version_counter_keep_sharing_it(self):
        # Found in review: an output that is no view but shares a version
        # counter with another (a detach of a dtype view) got its own, and
        # autograd's check of an in-place write to a saved tensor went quiet.
        def fn(x, w):
            y = x * 2
            return y, y.view(torch.int32), w * y

        compiled = aot_function(
            fn, fw_compiler=compile_unlowered, bw_compiler=compile_unlowered
        )
        with FakeTensorMode():
            for _ in range(4):
                w = torch.randn(4, requires_grad=True)
                y, as_int, loss = compiled(torch.randn(4), w)
                with torch.no_grad():
                    as_int.add_(1)
                with self.assertRaisesRegex(RuntimeError, "modified by an inplace"):
                    loss.sum().backward()
        self.assertGreater(counters["fake_mode"]["graphs_replayed"], 0)

    def test_data_dependent_sizes_are_not_replayed(self):
        # Found in review: an unbacked size of one call must not be handed to
        # the next.
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        compiled = aot_function(lambda x: x.nonzero(), fw_compiler=compile_unlowered)
        with FakeTensorMode(shape_env=ShapeEnv()):
            sizes = [compiled(torch.randn(8)).shape[0] for _ in range(4)]
        self.assertEqual(len({str(size) for size in sizes}), 4)
        self.assertEqual(counters["fake_mode"]["graphs_replayed"], 0)

    def test_forward_mode_ad_is_not_replayed(self):
        # Found in review: plain and dual calls share an entry, and a replay
        # dropped the tangents the graph's ops compute.
        import torch.autograd.forward_ad as fwAD

        compiled = torch.compile(lambda x: (x.sin() * 2, x.t()), backend="aot_eager")
        with FakeTensorMode():
            for _ in range(3):
                compiled(torch.randn(3, 3))
            self.assertGreater(counters["fake_mode"]["graphs_replayed"], 0)
            with fwAD.dual_level():
                outs = compiled(fwAD.make_dual(torch.randn(3, 3), torch.randn(3, 3)))
                tangents = [fwAD.unpack_dual(out).tangent for out in outs]
        self.assertEqual([t is not None for t in tangents], [True, True])

    def test_dtype_views_of_outputs_keep_their_dtype(self):
        # The cases the replay once got wrong: a dtype view of an output came
        # back with its base's dtype.
        def fn(x):
            y = x * 2
            yc = torch.view_as_complex(x.reshape(4, 3, 2) + 0)
            return y, y.view(torch.int32), torch.view_as_real(yc * 2), yc * 1

        compiled = aot_function(
            fn, fw_compiler=compile_unlowered, bw_compiler=compile_unlowered
        )
        with FakeTensorMode() as mode, torch.no_grad():
            first = describe([], compiled(torch.randn(4, 6)), [], [], mode)
            for _ in range(2):
                again = describe([], compiled(torch.randn(4, 6)), [], [], mode)
                self.assertEqual(again, first)
        self.assertGreater(counters["fake_mode"]["graphs_replayed"], 0)
        self.assertEqual(
            [meta[2] for meta in first[:4]],
            [torch.float32, torch.int32, torch.float32, torch.complex64],
        )


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
