"""
Module attribution of the graphs a call under a user's FakeTensorMode shows
to trackers: where a graph crosses a module boundary, the module trackers on
this thread's mode stack enter and leave the call's modules, as module and
gradient hooks make them in eager. See Note [Trackers see the compiled run of
a fake call] in fake_mode_trackers.py; fake_mode_observed_graphs.py puts the
boundaries in the graphs.
"""

import re
import sys
import threading
import warnings
import weakref
from typing import Any, Callable, Optional

import torch
from torch.autograd.graph import register_multi_grad_hook
from torch.utils import _python_dispatch


class _ObservedCalls(threading.local):
    # Fake calls shown to trackers this thread is in.
    depth = 0

    def __init__(self) -> None:
        # The forward graph calls running on this thread (see _GraphCall).
        self.graph_calls: list["_GraphCall"] = []
        # The compiled modules the calls entered themselves (call_observed).
        self.entered_modules: list[Any] = []


_observed = _ObservedCalls()


def _warn_once(message: str) -> None:
    # Once per message and place, as the default warning filter shows it.
    warnings.warn(message, stacklevel=2)


def _module_tracker_types() -> tuple[type, ...]:
    # Exactly these: a subclass may change results. Not imported: none of
    # their hooks is registered.
    return tuple(
        getattr(sys.modules[name], cls)
        for name, cls in (
            ("torch.utils.module_tracker", "ModuleTracker"),
            ("torch.distributed._tools.mod_tracker", "ModTracker"),
        )
        if name in sys.modules
    )


def _only_observes(mode: Any) -> bool:
    """
    Whether the class that implements mode's __torch_dispatch__ declares that
    it only observes: a subclass that overrides __torch_dispatch__ declares
    it again, or it may change results.
    """
    for cls in type(mode).__mro__:
        if "__torch_dispatch__" in cls.__dict__:
            return cls.__dict__.get("_only_observes", False) is True
    return False


def _forward_inputs(*inputs: Any) -> None:
    """Which inputs of the forward graph are parameters, for its backward."""
    if _observed.graph_calls:
        call = _observed.graph_calls[-1]
        call.forward_inputs = len(inputs)
        call.parameters = {
            i: weakref.ref(t)
            for i, t in enumerate(inputs)
            if isinstance(t, torch.nn.Parameter)
        }


def _gradient_of_input(index: int, outputs: int, grad: Any) -> None:
    """
    A backward graph of outputs gradients made the gradient of its forward's
    input index: a MemTracker that hooked the gradients of that parameter
    books it as a gradient, as its gradient hook does in eager.
    """
    call = _current_graph_call(backward_graph=True)
    # One gradient per forward input, in order (else, as with effect tokens,
    # the gradients are booked by AccumulateGrad's hook only).
    if call is None or call.forward_inputs != outputs or not isinstance(grad, torch.Tensor):
        return
    param = call.parameters.get(index)
    param = param() if param is not None else None
    # AccumulateGrad copies a gradient whose layout is not its parameter's:
    # that one stays a temporary.
    if param is None or (grad.shape, grad.stride(), grad.dtype) != (
        param.shape,
        param.stride(),
        param.dtype,
    ):
        return
    for mode in _python_dispatch._get_current_dispatch_mode_stack():
        handles = getattr(mode, "_param_to_grad_hook_handles", None)
        if _only_observes(mode) and handles is not None and param in handles:
            from torch.distributed._tools.mem_tracker import _MemRefType

            mode._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)


_PATH = re.compile(r"(L|G)\[(['\"])(.+?)\2\]")


_STEP = re.compile(r"\.(\w+)|\[(\d+)\]|\[(['\"])(.+?)\3\]")


class _GraphCall:
    """
    The modules one call of a compiled frame's graphs runs, by the key its
    graphs' module stacks name them by (weakly: the backward finds them on
    its autograd node).
    """

    def __init__(self, paths: dict[str, str], scope: dict[str, dict[str, Any]]) -> None:
        self.modules: dict[str, Any] = {}
        # The module trackers its forward graphs ran under: its backward
        # graphs drive those only (another saw no forward to book against).
        self.trackers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        # Its forward graph's inputs: how many, and which are parameters.
        self.forward_inputs = -1
        self.parameters: dict[int, Any] = {}
        for key, path in paths.items():
            module = _resolve(path, scope)
            if module is not None and any(module is m for m in _observed.entered_modules):
                # Dynamo traced its call (a module it skips, compiled in
                # place): it entered where the call did, as in eager.
                continue
            if module is None:
                _warn_once(
                    f"Trackers shown a compiled call under a FakeTensorMode: the "
                    f"module {path} of a compiled graph could not be found in the "
                    "frame, its ops are attributed to the modules around it"
                )
                continue
            self.modules[key] = weakref.ref(module)

    def module(self, key: str) -> Optional[torch.nn.Module]:
        ref = self.modules.get(key)
        return ref() if ref is not None else None


def _resolve(path: str, scope: dict[str, dict[str, Any]]) -> Optional[Any]:
    """The module at path (L['self'].layers[0].mlp) in the frame's scope."""
    match = _PATH.match(path)
    if match is None:
        return None
    names = scope[match.group(1)]
    if match.group(3) not in names:
        return None
    obj = names[match.group(3)]
    rest = path[match.end() :]
    while rest:
        step = _STEP.match(rest)
        if step is None:
            return None
        attr, index, _, key = step.groups()
        try:
            if attr is not None:
                obj = getattr(obj, attr)
            elif index is not None:
                obj = obj[int(index)]
            else:
                obj = obj[key]
        except (AttributeError, IndexError, KeyError, TypeError):
            return None
        rest = rest[step.end() :]
    return obj if isinstance(obj, torch.nn.Module) else None


_GRAPH_CALL = "torch._dynamo.fake_mode_attribution.graph_call"

def attach_to_backward(call: _GraphCall, outputs: Any) -> None:
    """Puts call on the autograd node of the backend's backward graphs for
    outputs: its backward graphs run on that node."""
    pending = [
        out.grad_fn
        for out in (outputs if isinstance(outputs, (list, tuple)) else [outputs])
        if isinstance(out, torch.Tensor) and out.grad_fn is not None
    ]
    seen = set()
    # AOTAutograd's node for the backend's backward graphs: the outputs'
    # own, or one below the nodes of views of them.
    for _ in range(3):
        following = []
        for node in pending:
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if type(node).__name__.startswith("CompiledFunction"):
                node.metadata[_GRAPH_CALL] = call
            else:
                following += [fn for fn, _ in node.next_functions]
        pending = following


def _current_graph_call(backward_graph: Optional[bool] = None) -> Optional[_GraphCall]:
    """
    The call whose graph runs: a backward graph's is on the autograd node
    running it, a forward graph's on this thread (None: either).
    """
    if backward_graph is not False:
        node = torch._C._current_autograd_node()
        if node is not None and (call := node.metadata.get(_GRAPH_CALL)) is not None:
            return call
        if backward_graph:
            return None
    return _observed.graph_calls[-1] if _observed.graph_calls else None


def _cross_module_boundary(
    left: tuple[tuple[str, tuple[Any, ...]], ...],
    entered: tuple[tuple[str, tuple[Any, ...]], ...],
    backward_graph: bool,
) -> None:
    """
    The module trackers on this thread's mode stack leave and enter modules
    of the call running the graph, as module hooks and gradient hooks make
    them in eager (see Note [Trackers see the compiled run of a fake call]).
    """
    call = _current_graph_call(backward_graph)
    if call is None:
        return
    trackers = _module_trackers()
    if backward_graph:
        trackers = [t for t in trackers if t in call.trackers]
    else:
        call.trackers.update(trackers)
    if not trackers:
        return
    backward = torch._C._current_graph_task_id() != -1
    # A graph run op by op under autograd (the eager backend's): its
    # gradient hooks, as in eager, mark the backward's modules.
    hooks = torch.is_grad_enabled() and not backward
    for key, outputs in left:
        if (module := call.module(key)) is not None:
            for tracker in reversed(trackers):
                _leave(tracker, module, backward, hooks, _activations(outputs))
    for key, inputs in entered:
        if (module := call.module(key)) is not None:
            inputs = _activations(inputs)
            for tracker in trackers:
                _enter(tracker, module, backward, hooks, inputs)


def _module_trackers() -> list[Any]:
    """The module trackers of the trackers on this thread's mode stack."""
    return [
        tracker
        for mode in _python_dispatch._get_current_dispatch_mode_stack()
        if _only_observes(mode) and (tracker := _module_tracker_of(mode)) is not None
    ]


def _module_tracker_of(mode: Any) -> Optional[Any]:
    """The module tracker a tracker attributes by (FlopCounterMode's, MemTracker's)."""
    tracker = getattr(getattr(mode, "counter", None), "mod_tracker", None)
    if tracker is None:
        tracker = getattr(mode, "_mod_tracker", None)
    return tracker if type(tracker) in _module_tracker_types() else None


def _activations(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """A region's values but parameters: what a module is called with and returns."""
    return tuple(v for v in values if not isinstance(v, torch.nn.Parameter))


def _requiring_grad(values: tuple[Any, ...]) -> list[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor) and v.requires_grad]


def _enter(tracker: Any, module: Any, backward: bool, hooks: bool, inputs: Any) -> None:
    """
    tracker enters module as its forward pre-hook and the gradient hooks it
    registers make it in eager (for a module inside torch.compile(module)
    too, which ModTracker's hooks skip: its ops are the graph's). With hooks
    (a graph run op by op under autograd), the backward leaves the module
    once its inputs have a gradient, as in eager, but on the first one (a
    region's inputs are more than the module's arguments: waiting for all
    would hold their gradients).
    """
    transitions = _Transitions(tracker, module)
    transitions.append(backward)()
    if backward:
        return
    if getattr(tracker, "_user_pre_fw_hook", None) is not None:
        tracker._user_pre_fw_hook(module, inputs)
    if hooks:
        if tensors := _requiring_grad(inputs):
            transitions.hook(register_multi_grad_hook(tensors, transitions.pop(True), mode="any"))
        elif hasattr(tracker, "_post_bw_callbacks_to_enqueue"):
            tracker._post_bw_callbacks_to_enqueue.append(transitions.pop(True))


def _leave(tracker: Any, module: Any, backward: bool, hooks: bool, outputs: Any) -> None:
    """tracker leaves module as its forward hook makes it in eager."""
    transitions = _Transitions(tracker, module)
    if not backward and getattr(tracker, "_user_post_fw_hook", None) is not None:
        tracker._user_post_fw_hook(module, (), outputs)
    transitions.pop(backward)()
    if hooks and not backward and (tensors := _requiring_grad(outputs)):
        transitions.hook(register_multi_grad_hook(tensors, transitions.append(True), mode="any"))


class _Transitions:
    """A module tracker's own functions that enter and leave module."""

    def __init__(self, tracker: Any, module: Any) -> None:
        self.tracker = tracker
        name = tracker._get_mod_name(module)
        # ModTracker's take the module (weakly), ModuleTracker's do not.
        self.key = (name,) if not hasattr(tracker, "_user_pre_fw_hook") else (weakref.ref(module), name)

    def append(self, backward: bool) -> Callable[..., None]:
        return self.tracker._get_append_fn(*self.key, backward)

    def pop(self, backward: bool) -> Callable[..., None]:
        return self.tracker._get_pop_fn(*self.key, backward)

    def hook(self, handle: Any) -> None:
        # ModuleTracker removes its gradient hooks on exit.
        if isinstance(getattr(self.tracker, "_hooks", None), list):
            self.tracker._hooks.append(handle)
