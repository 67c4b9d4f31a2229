"""
What the `call` of a wrapper Inductor generated runs besides its own
statements when it runs under a user's FakeTensorMode (see Note [Inductor's
buffers in a fake call] in fake_mode_wrapper.py), added when it is loaded:
  - for trackers shown the compiled run (the trackers patch, torch 2.13 on),
    module boundaries and gradient bookings, as the graphs shown to them
    have (see Note [Trackers see the compiled run of a fake call] in
    torch/_dynamo/fake_mode_trackers.py);
  - for planned_peaks(), each buffer it allocates, or reuses under a new
    name.
"""

import ast
import contextlib
import dataclasses
import re
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Optional

import torch
from torch.utils import _pytree as pytree


@dataclasses.dataclass
class PlannedBuffer:
    name: str
    nbytes: int
    # The module whose op made its value, as a path from the compiled
    # frame's root ("layers.0.mlp"; "" outside any module or where its FX
    # node does not say).
    module: str


@dataclasses.dataclass
class GraphPeak:
    """One run of a compiled graph under a FakeTensorMode: the most bytes
    the buffers it allocated (not its inputs) held at once, and those
    buffers."""

    graph: str
    peak: int
    buffers: list[PlannedBuffer]


class PlannedPeaks(list[GraphPeak]):
    def __str__(self) -> str:
        lines = []
        for run in self:
            lines.append(f"{run.graph}: planned peak {run.peak / 2**20:.1f} MiB")
            for buffer in sorted(run.buffers, key=lambda b: -b.nbytes):
                mib = buffer.nbytes / 2**20
                lines.append(f"  {buffer.name:>8} {mib:9.2f} MiB  {buffer.module or '-'}")
        return "\n".join(lines)


class _Collecting(threading.local):
    peaks: Optional[PlannedPeaks] = None


_collecting = _Collecting()


@contextlib.contextmanager
def planned_peaks() -> Iterator[PlannedPeaks]:
    """
    Collects, on this thread, a GraphPeak for each run of a graph that
    Inductor planned for a call under a FakeTensorMode (with
    torch._dynamo.config.fake_mode_plans_inductor_buffers): the peak of its
    buffers in Inductor's plan, the buffers alive at it and the modules
    whose ops made them.
    """
    previous = _collecting.peaks
    _collecting.peaks = peaks = PlannedPeaks()
    try:
        yield peaks
    finally:
        _collecting.peaks = previous


def _nbytes(storage: torch.UntypedStorage) -> int:
    nbytes = storage.nbytes()
    if isinstance(nbytes, torch.SymInt):
        # A user's ShapeEnv: its hint, not a guard.
        return nbytes.node.hint or 0
    return nbytes


def collecting_planned_peaks() -> bool:
    return _collecting.peaks is not None


def _storages(value: Any) -> list[torch.UntypedStorage]:
    return [
        leaf.untyped_storage()
        for leaf in pytree.tree_leaves(value)
        if isinstance(leaf, torch.Tensor)
    ]


class _Run:
    """
    The buffers one run of a graph allocated, alive while their storages
    are (weakly: a storage keeps its Python object while it lives, and the
    `del`s, aliases and outputs of the wrapper decide when it dies), as a
    log of allocations, frees and renames, replayed up to the peak once the
    run is done.
    """

    def __init__(self, graph: str, modules: dict[str, str], inputs: Any) -> None:
        self.graph = graph
        self.modules = modules
        self.inputs = {id(s): weakref.ref(s) for s in _storages(inputs)}
        # id(storage) -> (its weak reference, its index in the log)
        self.storages: dict[int, tuple[weakref.ref, int]] = {}
        # ("allocated" | "renamed" | "freed", index of the allocation, name, bytes)
        self.log: list[tuple[str, int, str, int]] = []
        self.total = self.peak = 0
        self.peak_at = 0

    def _own(self, storage: torch.UntypedStorage) -> Optional[int]:
        """The log index of storage's allocation in this run, if any."""
        entry = self.storages.get(id(storage))
        return entry[1] if entry is not None and entry[0]() is storage else None

    def allocated(self, name: str, value: Any) -> None:
        for storage in _storages(value):
            ref = self.inputs.get(id(storage))
            if (ref is not None and ref() is storage) or self._own(storage) is not None:
                continue
            index, nbytes = len(self.log), _nbytes(storage)
            self.log.append(("allocated", index, name, nbytes))
            self.storages[id(storage)] = (weakref.ref(storage, self._freed(index, nbytes)), index)
            self.total += nbytes
        if self.total > self.peak:
            self.peak, self.peak_at = self.total, len(self.log)

    def _freed(self, index: int, nbytes: int) -> Callable[[Any], None]:
        def freed(ref: Any) -> None:
            self.total -= nbytes
            self.log.append(("freed", index, "", nbytes))

        return freed

    def renamed(self, name: str, value: Any) -> None:
        """A buffer reused for another one (`bufN = bufM; del bufM`), or an
        output of a fallback op's tuple (`bufN = bufM[0]`)."""
        for storage in _storages(value):
            if (index := self._own(storage)) is not None:
                self.log.append(("renamed", index, name, 0))

    def done(self) -> None:
        if _collecting.peaks is None:
            return
        alive: dict[int, PlannedBuffer] = {}
        for event, index, name, nbytes in self.log[: self.peak_at]:
            if event == "freed":
                alive.pop(index, None)
            elif event == "allocated" or index in alive:
                nbytes = nbytes if event == "allocated" else alive[index].nbytes
                alive[index] = PlannedBuffer(name, nbytes, self.modules.get(name, ""))
        _collecting.peaks.append(GraphPeak(self.graph, self.peak, list(alive.values())))


def _begin(graph: str, modules: dict[str, str], inputs: Any) -> Optional[_Run]:
    return _Run(graph, modules, inputs) if _collecting.peaks is not None else None


def _module_path(stack: Optional[dict[str, Any]]) -> str:
    """The innermost module's path in a module stack, from the compiled
    frame's root: L['self'].layers[0]._modules['mlp'] -> layers.0.mlp."""
    if not stack:
        return ""
    path, _ = list(stack.values())[-1]
    path = re.sub(r"^[LG]\[(['\"]).+?\1\]", "", path)
    path = re.sub(r"\[(['\"]?)([^\]'\"]+)\1\]", r".\2", path)
    return path.replace("._modules.", ".").lstrip(".")


def _buffer_module_stacks(graph: Any) -> dict[str, Optional[dict[str, Any]]]:
    """
    The module stack of each buffer of the graph being lowered, by name: its
    origin node's, else its last origin's (see _module_stack in
    torch/_dynamo/fake_mode_observed_graphs.py, if the series has it).
    """
    try:
        from torch._dynamo.fake_mode_observed_graphs import _module_stack
    except ImportError:

        def _module_stack(node: torch.fx.Node) -> Optional[dict[str, Any]]:
            meta = node.meta
            return meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack")

    order = {node: i for i, node in enumerate(graph.graph.nodes)}
    stacks = {}
    for name, buffer in graph.name_to_buffer.items():
        node = getattr(buffer, "origin_node", None)
        if node is None:
            origins = getattr(buffer, "origins", ())
            node = max(origins, key=lambda n: order.get(n, -1), default=None)
        stacks[name] = _module_stack(node) if node is not None else None
    return stacks


def _written_buffer(statement: ast.stmt) -> Optional[str]:
    """The buffer a statement of the wrapper's call allocates, aliases or
    writes: `bufN = ...`, `kernel(..., out=bufN)`."""
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target = statement.targets[0]
        return target.id if isinstance(target, ast.Name) else None
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        for keyword in statement.value.keywords:
            if keyword.arg == "out" and isinstance(keyword.value, ast.Name):
                return keyword.value.id
    return None


def _allocates(statement: ast.stmt) -> bool:
    """`bufN = empty_strided_cpu(...)`, `bufN = torch.ops.aten.op(...)`: not
    an alias (`bufN = bufM`, reinterpret_tensor, `bufM[0]`)."""
    if not (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Call)):
        return False
    func = statement.value.func
    return not (isinstance(func, ast.Name) and func.id == "reinterpret_tensor")


def _reuses(statement: ast.stmt, following: list[ast.stmt]) -> bool:
    """
    `bufN = bufM[0]` (a fallback op's output), or Inductor's reuse of a dead
    buffer for another: `bufN = bufM; del bufM`, `bufN = reinterpret_tensor(
    bufM, ...); del bufM`.
    """
    value = statement.value  # type: ignore[attr-defined]
    if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name):
        return True
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        if value.func.id != "reinterpret_tensor" or not value.args:
            return False
        value = value.args[0]
    deleted = [_names(s, ast.Del) for s in following if isinstance(s, ast.Delete)]
    return isinstance(value, ast.Name) and [value.id] in deleted


def _names(node: ast.AST, context: type) -> list[str]:
    return [
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, context)
    ]


def _tuple_source(names: Any) -> str:
    return "(" + "".join(f"{name}, " for name in dict.fromkeys(names)) + ")"


class _Call:
    """
    The statements of a wrapper's call, with where each name is defined and
    read. Inductor's wrapper assigns each name once, in straight-line code.
    """

    def __init__(self, call: ast.FunctionDef) -> None:
        self.body = call.body
        # The graph's inputs: `primals_1, ... = args`.
        self.unpack = next(
            (
                i
                for i, s in enumerate(self.body)
                if isinstance(s, ast.Assign)
                and isinstance(s.value, ast.Name)
                and s.value.id == "args"
            ),
            -1,
        )
        unpack = self.body[self.unpack] if self.unpack >= 0 else None
        assert unpack is None or isinstance(unpack, ast.Assign)
        self.inputs = _names(unpack.targets[0], ast.Store) if unpack else []
        # AOTAutograd's backward graphs take tangents.
        self.backward_graph = any(name.startswith("tangents") for name in self.inputs)
        self.defined = dict.fromkeys(self.inputs, self.unpack)
        for i, statement in enumerate(self.body):
            for name in _names(statement, ast.Store):
                self.defined.setdefault(name, i)
        self.loads = [_names(statement, ast.Load) for statement in self.body]

    def used_from_before(self, start: int, end: int) -> list[str]:
        return [
            n for i in range(start, end) for n in self.loads[i] if self.defined.get(n, i) < start
        ]

    def used_after(self, start: int, end: int) -> list[str]:
        later = {n for i in range(end, len(self.body)) for n in self.loads[i]}
        return [n for n, i in self.defined.items() if start <= i < end and n in later]


def _module_boundaries(
    call: _Call, stacks: dict[str, Optional[dict[str, Any]]], added: dict[int, list[str]]
) -> None:
    """
    Adds to added (statements' source by the index they go before) the
    crossings of module boundaries before the statements of call that name
    a buffer (see _written_buffer) and before its return, as
    _add_module_boundaries in torch/_dynamo/fake_mode_observed_graphs.py
    makes them before a graph's nodes, and the gradient bookings of a
    backward graph, as _add_gradient_bookings does.
    """
    crossings: list[tuple[int, list[tuple[str, int]], list[str]]] = []
    entered: list[tuple[str, int]] = []
    for i, statement in enumerate(call.body):
        if isinstance(statement, ast.Return):
            keys: list[str] = []
        elif (stack := stacks.get(_written_buffer(statement) or "")) is not None:
            keys = list(stack)
        else:
            continue
        common = 0
        while common < min(len(entered), len(keys)) and entered[common][0] == keys[common]:
            common += 1
        if common == len(entered) == len(keys):
            continue
        crossings.append((i, list(reversed(entered[common:])), keys[common:]))
        entered = entered[:common] + [(key, i) for key in keys[common:]]
    if not crossings:
        return
    ends = {region: i for i, left, _ in crossings for region in left}
    for i, left, keys in crossings:
        left_values = "".join(
            f"({k!r}, {_tuple_source(call.used_after(s, i))}), " for k, s in left
        )
        entered_values = "".join(
            f"({k!r}, {_tuple_source(call.used_from_before(i, ends.get((k, i), i)))}), "
            for k in keys
        )
        added.setdefault(i, []).append(
            f"_cross_module_boundary(({left_values}), ({entered_values}), {call.backward_graph})"
        )

    def after(i: int, source: str) -> None:
        added.setdefault(i + 1, []).insert(0, source)

    if not call.backward_graph and call.unpack >= 0:
        after(call.unpack, f"_forward_inputs(*{_tuple_source(call.inputs)})")
    (returns,) = [s for s in call.body if isinstance(s, ast.Return)]
    grads = returns.value.elts if isinstance(returns.value, ast.Tuple) else []
    for index, grad in enumerate(grads if call.backward_graph else ()):
        if not (isinstance(grad, ast.Constant) and grad.value is None):
            names = _names(grad, ast.Load)
            made = max((call.defined.get(n, call.unpack) for n in names), default=call.unpack)
            after(made, f"_gradient_of_input({index}, {len(grads)}, {ast.unparse(grad)})")


def _without_device_guards(body: list[ast.stmt]) -> list[ast.stmt]:
    """
    body, with the statements of each `with torch.cuda._DeviceGuard(i):`
    block (a GPU wrapper's) in place of the block: the guard selects the
    device its kernels run on, and no kernel runs in a fake call.
    """
    flat: list[ast.stmt] = []
    for statement in body:
        if (
            isinstance(statement, ast.With)
            and len(statement.items) == 1
            and isinstance(guard := statement.items[0].context_expr, ast.Call)
            and isinstance(guard.func, ast.Attribute)
            and guard.func.attr == "_DeviceGuard"
        ):
            flat.extend(statement.body)
        else:
            flat.append(statement)
    return flat


def instrument(tree: ast.Module, graph: Any, scope: dict[str, Any]) -> bool:
    """
    Adds to the call in tree, the wrapper module of graph (a GraphLowering),
    the statements this module's docstring says, and what they call to
    scope. Whether trackers see its buffers in their modules; False, with
    tree as it was but for its device guards, where its call is not
    straight-line code ending in a return (config.profiler_mark_wrapper_call
    puts it in a `with`, as a stream's or memory pool's context).
    """
    function = next(
        (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "call"),
        None,
    )
    if function is None or not hasattr(graph, "name_to_buffer"):
        return False
    function.body = _without_device_guards(function.body)
    call = _Call(function)
    if sum(isinstance(s, ast.Return) for s in call.body) != 1 or any(
        isinstance(s, ast.With) for s in call.body
    ):
        return False
    stacks = _buffer_module_stacks(graph)
    added: dict[int, list[str]] = {}
    try:
        from torch._dynamo import fake_mode_attribution as attribution
    except ImportError:
        attributed = False
    else:
        _module_boundaries(call, stacks, added)
        for name in ("_cross_module_boundary", "_forward_inputs", "_gradient_of_input"):
            scope[name] = getattr(attribution, name)
        attributed = True
    # planned_peaks(): each buffer allocated, or reused under a new name.
    compile_id = torch._guards.CompileContext.current_compile_id()
    graph_name = f"{compile_id} {'backward' if call.backward_graph else 'forward'}"
    added.setdefault(call.unpack + 1, []).insert(
        0,
        f"_fake_mode_run = _fake_mode_begin({graph_name!r}, _fake_mode_modules, "
        f"{_tuple_source(call.inputs)})",
    )
    for i, statement in enumerate(call.body):
        name = _written_buffer(statement) if isinstance(statement, ast.Assign) else None
        how = None
        if name is not None and _allocates(statement):
            how = "allocated"
        elif name is not None and _reuses(statement, call.body[i + 1 : i + 2]):
            how = "renamed"
        if how is not None:
            added.setdefault(i + 1, []).append(
                f"if _fake_mode_run is not None: _fake_mode_run.{how}({name!r}, {name})"
            )
        elif isinstance(statement, ast.Return):
            added.setdefault(i, []).append("if _fake_mode_run is not None: _fake_mode_run.done()")
    modules = {name: _module_path(stack) for name, stack in stacks.items()}
    scope.update(_fake_mode_begin=_begin, _fake_mode_modules=modules, _fake_mode_instrumented=True)
    body = []
    for i, statement in enumerate([*call.body, None]):
        for source in added.get(i, ()):
            (new,) = ast.parse(source).body
            for node in ast.walk(new):
                if "lineno" in node._attributes:
                    # Where the wrapper's call starts.
                    node.lineno = node.end_lineno = function.lineno  # type: ignore[attr-defined]
            body.append(new)
        if statement is not None:
            body.append(statement)
    function.body = body
    return attributed
