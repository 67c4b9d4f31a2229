"""
Replaying an unlowered graph's outputs from their metadata: a repeated fake
call of a graph an AOTAutograd backend built makes its outputs again without
running the graph's ops. See Note [Replaying a graph's outputs from their
metadata] below, and Note [Inheriting the ambient FakeTensorMode] in
ambient_fake_mode.py.
"""

import logging
from collections.abc import Sequence
from typing import Any, Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from .utils import counters


log = logging.getLogger(__name__)

# What torch._guards.active_fake_mode() finds by walking the mode stack, in
# O(1): a FakeTensorMode is the mode stack's FAKE infra mode. Every call asks.
_get_dispatch_mode = torch._C._get_dispatch_mode
_FAKE = torch._C._TorchDispatchModeKey.FAKE


class Replay:
    """
    How an unlowered graph made its outputs, per inputs' metadata, for calls
    the graph's ops need not see: a repeated fake call makes its outputs
    again from the record instead of running the graph op by op, as
    FakeTensorMode's dispatch cache does for one op (and for Inductor's
    compiled regions under wrap_inductor_compiled_regions). Only for graphs
    of ATen ops that mutate nothing, calls under one FakeTensorMode with
    static shapes, outside inference mode, with no other dispatch mode or
    functorch transform (which must see the ops).

    See Note [Replaying a graph's outputs from their metadata].
    """

    MAX_ENTRIES = 8

    def __init__(self) -> None:
        # key -> how to make the outputs, or None where the graph runs.
        self.entries: dict[Any, Optional[tuple[Any, ...]]] = {}

    def key(self, args: Sequence[Any]) -> Optional[tuple[tuple[Any, ...], FakeTensorMode]]:
        """The call's key and mode, or None if it must run the graph."""
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        mode = _get_dispatch_mode(_FAKE)
        if (
            len(_get_current_dispatch_mode_stack()) > (mode is not None)
            or torch._C._functorch.peek_interpreter_stack() is not None
            or torch.is_inference_mode_enabled()
            # Forward-mode AD: the graph's ops compute the outputs' tangents.
            or torch.autograd.forward_ad._current_level >= 0
        ):
            return None
        key: list[Any] = [
            torch.is_grad_enabled(),
            torch.is_autocast_enabled("cpu"),
            torch.get_autocast_dtype("cpu"),
            torch.is_autocast_enabled("cuda"),
            torch.get_autocast_dtype("cuda"),
            torch.get_default_dtype(),
        ]
        # Which inputs are one tensor, or share a storage: outputs that are
        # inputs or their views are made from the same ones.
        storages: dict[int, int] = {}
        for index, arg in enumerate(args):
            if isinstance(arg, torch.Tensor):
                # Real tensors (a FakeTensorMode(allow_non_fake_inputs=True)
                # fakes them as the graph's ops run) count by metadata too.
                if type(arg) is FakeTensor:
                    if mode is None:
                        mode = arg.fake_mode
                    elif arg.fake_mode is not mode:
                        return None
                    if arg.constant is not None:
                        return None
                elif type(arg) not in (torch.Tensor, torch.nn.Parameter):
                    return None
                if arg._has_symbolic_sizes_strides or arg.layout != torch.strided:
                    return None
                key.append(
                    (
                        arg.shape,
                        arg.stride(),
                        arg.storage_offset(),
                        arg.dtype,
                        arg.device,
                        arg.requires_grad,
                        arg.is_conj(),
                        arg.is_neg(),
                        # A view of an input is made on its storage.
                        arg.untyped_storage().nbytes(),
                        storages.setdefault(arg.untyped_storage()._cdata, index),
                    )
                )
            elif isinstance(arg, (int, float, bool, type(None))):
                key.append((type(arg), arg))
            else:
                return None
        if mode is None or getattr(mode, "propagate_real_tensors", False):
            return None
        # Real inputs raise under a mode that does not allow them.
        key.append(mode.allow_non_fake_inputs)
        return tuple(key), mode

    def outputs(
        self, key: tuple[Any, ...], mode: FakeTensorMode, args: Sequence[Any]
    ) -> Optional[Any]:
        recorded = self.entries.get(key)
        if recorded is None:
            return None
        try:
            outputs = _rebuild(recorded, mode, args)
        except Exception:
            # What the record proved for one call does not hold for this one:
            # the graph runs, now and for later calls with this key.
            log.debug("Not replayed: rebuilding the outputs failed", exc_info=True)
            self.entries[key] = None
            return None
        counters["fake_mode"]["graphs_replayed"] += 1
        return outputs

    def record(
        self,
        key: tuple[Any, ...],
        mode: FakeTensorMode,
        args: Sequence[Any],
        outputs: Any,
    ) -> None:
        """Keep how the call made its outputs, if rebuilding them from that
        gives back exactly what the graph made."""
        if key in self.entries or len(self.entries) >= self.MAX_ENTRIES:
            return
        self.entries[key] = None
        facts = replay_facts(mode, args, outputs)
        recorded = _recipes(facts)
        if recorded is None:
            return
        try:
            rebuilt = _rebuild(recorded, mode, args)
        except Exception:
            log.debug("Not replayed: rebuilding the outputs failed", exc_info=True)
            return
        if replay_facts(mode, args, rebuilt) != facts:
            log.debug("Not replayed: the rebuilt outputs differ from the graph's")
            return
        self.entries[key] = recorded


# Note [Replaying a graph's outputs from their metadata]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A replayed output must be what running the graph would have made, or the
# fake call answers wrong without a word. So the record holds no metadata of
# its own choosing: it is made from replay_facts, what a replay must
# reproduce. Each output is an input or an earlier output (the same object),
# a value, or a tensor described by FakeTensorMode's own TensorMetadata (what
# its dispatch cache keys and rebuilds a cached output from: dtype, shape,
# stride, storage offset and bytes, device, layout, memory format,
# requires_grad, conj / neg bits, inference) together with the input or
# output it shares a storage with, has as _base, and shares a version counter
# with. A tensor of its own is rebuilt as the dispatch cache rebuilds one: a
# meta tensor of that metadata wrapped for the mode, set onto the storage it
# shares (wrapping a meta view of what it shares a version counter with, if
# it does). A view is made by an op, so autograd makes it a view, as the
# graph's op did (of its base, or of a base of a storage of its size where
# the graph does not return the base), through view_as_real / view_as_complex
# where its dtype is not its base's: one dispatch per view. A record is kept
# only after it proved itself: right after the graph ran, the outputs are
# rebuilt from it for the same inputs and their replay_facts compared; any
# difference, or anything the rebuild cannot make (data-dependent sizes), and
# the graph keeps running. Later calls with the same key (the inputs'
# metadata, storage sizes and aliasing, and the global state the ops read)
# rebuild from their own inputs; a rebuild that still fails drops the record.
# test_compile_under_fake_mode_replay.py checks it on generated graphs
# against running them.


def _recipes(facts: list[Any]) -> Optional[tuple[Any, ...]]:
    """How to make each output again, from its replay_facts, or None where
    the record cannot."""
    container, *outputs = facts
    if container not in (list, tuple):
        return None
    recipes: list[tuple[Any, ...]] = []
    for index, (kind, *fact) in enumerate(outputs):
        if kind == "is":
            recipes.append(fact[0])
        elif kind == "value":
            if fact[0] not in (int, float, bool, type(None)):
                return None
            recipes.append(("value", fact[1]))
        else:
            cls, owned, constant, metadata, *_, owner, base, counter = fact
            if (
                cls is not FakeTensor
                or not owned
                or constant
                or metadata.layout != torch.strided
                or _is_symbolic(metadata)
            ):
                return None
            if owner == ("output", index):
                owner = None
            # A non-view on the storage of what it shares a version counter
            # with (a detach of a view) is made from it.
            shares_counter = owner is not None and counter == owner
            recipes.append(("tensor", metadata, owner, base is not None, shares_counter))
    return container, tuple(recipes)


def _is_symbolic(metadata: Any) -> bool:
    """Whether metadata holds symbols (a data-dependent size): a replay would
    give a later call the first call's unbacked symbols."""
    return any(
        isinstance(value, torch.SymInt)
        for value in (
            *metadata.shape,
            *metadata.stride,
            metadata.storage_offset,
            metadata.storage_bytes,
        )
    )


def _positions(
    mode: FakeTensorMode, args: Sequence[Any]
) -> tuple[dict[int, tuple[str, int]], dict[Any, tuple[str, int]]]:
    """Which input each tensor input is, and whose storage each is."""
    from torch.multiprocessing.reductions import StorageWeakRef

    same: dict[int, tuple[str, int]] = {}
    owners: dict[Any, tuple[str, int]] = {}
    for index, arg in enumerate(args):
        if isinstance(arg, torch.Tensor):
            same.setdefault(id(arg), ("input", index))
            # The graph's ops see a real input as the mode's FakeTensor of it.
            owners.setdefault(
                StorageWeakRef(_as_fake(mode, arg).untyped_storage()), ("input", index)
            )
    return same, owners


def _as_fake(mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor:
    return t if isinstance(t, FakeTensor) else mode.from_tensor(t)


def _rebuild(recorded: tuple[Any, ...], mode: FakeTensorMode, args: Sequence[Any]) -> Any:
    container, recipes = recorded
    outputs: list[Any] = []
    # Views are made by ops (autograd makes them views), under the mode.
    with mode:
        for kind, *rest in recipes:
            if kind == "value":
                outputs.append(rest[0])
            elif kind == "input":
                outputs.append(args[rest[0]])
            elif kind == "output":
                outputs.append(outputs[rest[0]])
            else:
                metadata, owner, is_view, shares_counter = rest
                source = None
                if owner is not None:
                    where, index = owner
                    source = args[index] if where == "input" else outputs[index]
                    source = _as_fake(mode, source)
                outputs.append(
                    _make_tensor(mode, metadata, source, is_view, shares_counter)
                )
    return container(outputs)


def _make_tensor(
    mode: FakeTensorMode,
    m: Any,
    source: Optional[torch.Tensor],
    is_view: bool,
    shares_counter: bool,
) -> torch.Tensor:
    """A FakeTensor of metadata m on source's storage (a fresh one if None):
    a view of source if is_view, else a tensor of its own, sharing source's
    version counter if shares_counter. See Note [Replaying a graph's outputs
    from their metadata]."""
    from torch._subclasses.fake_tensor import in_kernel_invocation_manager

    if is_view:
        if source is None:
            # A view of an intermediate the graph does not return.
            with in_kernel_invocation_manager(mode):
                base = torch.empty(
                    (m.storage_bytes // m.dtype.itemsize,), dtype=m.dtype, device="meta"
                )
            source = FakeTensor(mode, base, m.device)
        # Autograd makes the op's output a view of source, as the graph's did
        # (_rebuild runs this under the mode).
        if source.dtype != m.dtype:
            source = _storage_as(source, m.dtype)
        made = source.as_strided(m.shape, m.stride, m.storage_offset)
        if made.is_conj() != m.is_conj:
            made = made.conj()
        if made.is_neg() != m.is_neg:
            made = torch._neg_view(made)
        return made
    with in_kernel_invocation_manager(mode):
        if shares_counter:
            # A meta view of source, wrapped as FakeTensorMode wraps a kernel's
            # output: a tensor of its own sharing source's version counter.
            if source.dtype != m.dtype:
                source = _storage_as(source, m.dtype)
            made = source.as_strided(m.shape, m.stride, m.storage_offset)
        else:
            made = torch.empty_strided(
                m.shape, m.stride, dtype=m.dtype, layout=m.layout, device="meta"
            )
            storage = None if source is None else source.untyped_storage()
            if storage is None and made.untyped_storage().nbytes() != m.storage_bytes:
                storage = torch.UntypedStorage(m.storage_bytes, device="meta")
            if storage is not None:
                # A fresh tensor's version counter is 0, as the op's output's.
                with torch.autograd._unsafe_preserve_version_counter(made):
                    made.set_(storage, m.storage_offset, m.shape, m.stride)
        if m.is_conj != made.is_conj():
            torch._C._set_conj(made, m.is_conj)
        if m.is_neg != made.is_neg():
            torch._C._set_neg(made, m.is_neg)
        made.requires_grad_(m.requires_grad)
    return FakeTensor(mode, made, m.device)


def _storage_as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A 1-d view of t's whole storage in dtype, made with view_as_real and
    view_as_complex where one dtype is complex (they keep the base, as the
    graph's ops did), else view(dtype); replay_facts tells a difference."""
    whole = t.as_strided((t.untyped_storage().nbytes() // t.dtype.itemsize,), (1,), 0)
    if whole.is_complex():
        whole = torch.view_as_real(whole).flatten()
    if dtype.is_complex:
        if whole.dtype != dtype.to_real():
            whole = whole.view(dtype.to_real())
        return torch.view_as_complex(whole.view(-1, 2))
    return whole if whole.dtype == dtype else whole.view(dtype)


def replay_facts(mode: FakeTensorMode, args: Sequence[Any], outputs: Any) -> list[Any]:
    """
    What a replay of outputs must reproduce, and all a record is made from:
    per output, a value, which input or earlier output it is, or, for a
    tensor, its type, whether mode owns it, whether it holds a constant, its
    TensorMetadata, version counter, leafness, grad_fn kind, which input or
    output it shares a storage with, has as _base (bases no input or output
    holds numbered as met) and shares its version counter with.
    """
    from torch._subclasses.fake_tensor import extract_tensor_metadata
    from torch.multiprocessing.reductions import StorageWeakRef

    facts: list[Any] = [type(outputs)]
    if not isinstance(outputs, (list, tuple)):
        return facts
    same, owners = _positions(mode, args)
    counters_of = _version_counters(args, outputs)
    bases: dict[int, tuple[str, int]] = {}
    for index, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor):
            facts.append(("value", type(out), out))
            continue
        if id(out) in same:
            facts.append(("is", same[id(out)]))
            continue
        same[id(out)] = ("output", index)
        base = out._base
        if base is not None:
            base = same.get(id(base)) or bases.setdefault(id(base), ("hidden", len(bases)))
        facts.append(
            (
                "tensor",
                type(out),
                getattr(out, "fake_mode", None) is mode,
                getattr(out, "constant", None) is not None,
                extract_tensor_metadata(out),
                out._version,
                out.is_leaf,
                type(out.grad_fn),
                owners.setdefault(StorageWeakRef(out.untyped_storage()), ("output", index)),
                base,
                counters_of[index],
            )
        )
    return facts


def _version_counters(args: Sequence[Any], outputs: Sequence[Any]) -> list[Any]:
    """
    Per output, the first input or output (by position) that shares its
    version counter, or None (not a tensor, or an inference tensor, which has
    none). Told by setting each counter to a mark in turn, then restoring
    them all.
    """
    tensors = [
        (("input", i), t) for i, t in enumerate(args) if isinstance(t, torch.Tensor)
    ] + [(("output", i), t) for i, t in enumerate(outputs) if isinstance(t, torch.Tensor)]
    tensors = [(where, t) for where, t in tensors if not t.is_inference()]
    versions = tuple(t._version for _, t in tensors)
    mark = 1 << 30
    first: dict[int, tuple[str, int]] = {}
    owner_of: dict[tuple[str, int], tuple[str, int]] = {}
    try:
        for number, (where, t) in enumerate(tensors):
            version = t._version
            if version >= mark and version - mark in first:
                owner_of[where] = first[version - mark]
            else:
                first[number] = where
                owner_of[where] = where
                torch._C._autograd._unsafe_set_version_counter((t,), (mark + number,))
    finally:
        torch._C._autograd._unsafe_set_version_counter(
            tuple(t for _, t in tensors), versions
        )
    return [owner_of.get(("output", i)) for i in range(len(outputs))]
