"""
Opt-in regions: an entry compiled for fake calls that runs op by op (the eager
backend, custom backends, or config.fake_mode_runs_backend_graphs = False) and
is called many times is replayed as one op that FakeTensorMode's dispatch cache
serves. Entries that run a backend's graphs run them on every call.

With config.fake_mode_region_after_calls = N, once an entry has made N calls
that autograd does not record, made without other dispatch modes or functorch
transforms, on FakeTensors of one mode, AOTAutograd traces a graph with static
inputs into one inference graph, called from then on as one fake_mode_region
op that FakeTensorMode's dispatch cache replays from its inputs' metadata: a
cache hit per call instead of a dispatch per op. Tracing it costs as much as
15 to 40 calls made op by op. The cache can only replay fresh tensors, so a
graph that mutates an input or returns a view or an alias keeps running op by
op. The cache entries are keyed on the region's graph module and go when the
compiled entry does. See Note [Inheriting the ambient FakeTensorMode] in
ambient_fake_mode.py.
"""

import logging
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch
import torch.utils._pytree as pytree
from torch import fx, Tensor
from torch._guards import tracing, TracingContext
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.symbolic_shapes import free_symbols
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from . import config
from .ambient_fake_mode import fake_modes_of, FakeModeRuntime
from .utils import counters


log = logging.getLogger(__name__)


def _other_dispatch_mode_active() -> bool:
    return any(
        not isinstance(mode, torch._subclasses.FakeTensorMode)
        for mode in _get_current_dispatch_mode_stack()
    )


def _may_replay(args: Sequence[Any]) -> bool:
    """
    Whether a call may run the graph as one replayed region: no other dispatch
    mode is there to see its ops, no functorch transform wraps it, autograd
    records nothing (a region is differentiable once, and its saved tensors
    and views would not be eager's), and every tensor is a FakeTensor of one
    mode (mixing modes raises as in eager; real tensors bypass the cache).
    """
    if (
        _other_dispatch_mode_active()
        or torch._C._functorch.peek_interpreter_stack() is not None
    ):
        return False
    grad_enabled = torch.is_grad_enabled()
    for arg in args:
        if isinstance(arg, Tensor) and (
            not isinstance(arg, FakeTensor) or (grad_enabled and arg.requires_grad)
        ):
            return False
    return len(fake_modes_of(args)) == 1


def _outputs_alias(gm: fx.GraphModule) -> bool:
    """
    Whether an output of gm aliases one of its inputs or another output: the
    dispatch cache would replay them as unrelated tensors.
    """
    from torch.multiprocessing.reductions import StorageWeakRef

    storages = set()
    for node in gm.graph.find_nodes(op="placeholder"):
        if isinstance(val := node.meta.get("val"), Tensor):
            storages.add(StorageWeakRef(val.untyped_storage()))
    for out in pytree.tree_leaves(gm.graph.output_node().args):
        if isinstance(out, fx.Node) and isinstance(val := out.meta.get("val"), Tensor):
            storage = StorageWeakRef(val.untyped_storage())
            if storage in storages:
                return True
            storages.add(storage)
    return False


class RegionFakeModeRuntime(FakeModeRuntime):
    """
    A FakeModeRuntime that, once the entry is hot, runs calls autograd does
    not record as one fake_mode_region.
    """

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.region: Optional[Callable[..., Any]] = None
        # Replayable calls so far; None once the graph runs op by op for good:
        # its inputs are symbolic, or an output is a view or was written in
        # place (a replayed output is a fresh tensor, without the view's
        # offset, storage and base, and with version counter 0).
        self.calls: Optional[int] = 0
        if any(
            free_symbols(node.meta.get("example_value"))
            for node in gm.graph.find_nodes(op="placeholder")
        ) or any(
            isinstance(out, fx.Node)
            and isinstance(val := out.meta.get("example_value"), Tensor)
            and (val._is_view() or val._version != 0)
            for out in pytree.tree_leaves(gm.graph.output_node().args)
        ):
            self.calls = None

    def __call__(self, *args: Any) -> Any:
        if self.backend_graphs is not None:
            # The backend's graphs are not the captured graph a region replays.
            return self.run(*args)
        if self.region is None:
            after_calls = config.fake_mode_region_after_calls
            if after_calls is None or self.calls is None or not _may_replay(args):
                return self.run(*args)
            if self.calls < after_calls:
                self.calls += 1
                return self.run(*args)
            self.region = self.compile_region(args)
            if self.region is None:
                self.calls = None
                return self.run(*args)
        if not _may_replay(args):
            return self.run(*args)
        return self.region(*args)

    def compile_region(self, args: Sequence[Any]) -> Optional[Callable[..., Any]]:
        from torch._higher_order_ops.fake_mode_region import fake_mode_region
        from torch._subclasses.fake_tensor import (
            DataDependentOutputException,
            DynamicOutputShapeException,
        )
        from torch.utils._python_dispatch import _disable_current_modes

        from .backends.common import aot_autograd

        region_gms: list[fx.GraphModule] = []

        def region_compiler(
            region_gm: fx.GraphModule, example_inputs: Sequence[Any]
        ) -> Callable[[list[Any]], Any]:
            region_gms.append(region_gm)

            def run(args: list[Any]) -> Any:
                with torch._C._AutoDispatchBelowAutograd():
                    return fake_mode_region(region_gm, *args)

            run._boxed_call = True  # type: ignore[attr-defined]
            return run

        # Tracing with a mode of our own never touches the caller's tensors.
        fake_mode = torch._subclasses.FakeTensorMode()
        tracing_context = TracingContext(fake_mode)
        try:
            with _disable_current_modes(), tracing(tracing_context):
                example_inputs = [
                    fake_mode.from_tensor(arg) if isinstance(arg, Tensor) else arg
                    for arg in args
                ]
                region = aot_autograd(fw_compiler=region_compiler)(
                    self.gm, example_inputs
                )
        except (DataDependentOutputException, DynamicOutputShapeException):
            # Only the caller's mode can run such a graph (if it has a
            # ShapeEnv); op by op it raises as eager does, or runs.
            return None
        except Exception:
            # The graph keeps running op by op, as it did until now.
            counters["fake_mode"]["regions_failed"] += 1
            log.warning(
                "Graph compiled for fake calls keeps running op by op: "
                "AOTAutograd failed on it",
                exc_info=True,
            )
            return None
        fw_metadata = tracing_context.fw_metadata
        if (
            fw_metadata is None
            or len(region_gms) != 1
            or any(
                info.mutates_data or info.mutates_metadata
                for info in fw_metadata.input_info
            )
            or any(info.requires_grad for info in fw_metadata.output_info)
            or _outputs_alias(region_gms[0])
        ):
            # Eager's own ops keep mutations, aliases and autograd right.
            return None
        # The region only runs its graph, which needs no metadata.
        for node in region_gms[0].graph.nodes:
            node.meta.clear()
        counters["fake_mode"]["regions_compiled"] += 1
        return region
