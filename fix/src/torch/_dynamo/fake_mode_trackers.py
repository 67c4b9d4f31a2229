"""
Trackers (dispatch modes that only observe) around compiled code called under
a user's FakeTensorMode see the compiled run; fullgraph=True for frames other
dispatch modes make Dynamo skip. See Note [Inheriting the ambient
FakeTensorMode] in ambient_fake_mode.py.
"""

import copy
import functools
import logging
import sys
import threading
import warnings
from typing import Any, Callable, Optional

import torch
from torch import fx
from torch._C._dynamo.eval_frame import set_eval_frame
from torch._C._dynamo.guards import set_is_in_mode_without_ignore_compile_internals
from torch.fx.graph_module import _get_attr
from torch.utils import _python_dispatch

from . import fake_mode_compat, fake_mode_guards
from .ambient_fake_mode import users_fake_mode


log = logging.getLogger(__name__)
_logged = False


def frames_run_eagerly_under_modes() -> bool:
    """
    Whether a fullgraph=True call that compiled no frame ran them eagerly on
    purpose: under a user's FakeTensorMode, a non-infra dispatch mode (a
    tracker such as FlopCounterMode, MemTracker or CommDebugMode) makes Dynamo
    skip frames, which run eagerly under the modes, as on stock, so the
    tracker sees their ops and their modules' hooks. That eager run is what
    the call is for (an estimate): fullgraph=True does not fail with "found
    no compiled frames" for it.
    """
    if (
        users_fake_mode() is None
        or not fake_mode_compat.dynamo_skips_for_dispatch_mode()
    ):
        return False
    global _logged
    if not _logged:
        _logged = True
        log.info(
            "fullgraph=True under a FakeTensorMode: frames a dispatch mode makes "
            "Dynamo skip ran eagerly under the modes instead of failing"
        )
    return True


# Note [Trackers see the compiled run of a fake call]
# A call under a user's FakeTensorMode is an estimate of the compiled run, and
# people make it under trackers: FlopCounterMode, MemTracker / FSDPMemTracker.
# These modes declare that they only observe (a class attribute
# _only_observes on the class implementing __torch_dispatch__). Dynamo skips
# frames under a dispatch mode, so such a call would show the trackers eager's
# ops, and Dynamo cannot trace the module hooks they install (ModuleTracker's,
# ModTracker's, FSDPMemTracker's FSDP hooks) anyway. Under a user's
# FakeTensorMode, when every mode on the stack only observes or ignores
# compile internals, a call of a compiled function or module instead:
# - swaps the global module forward hook dicts and those of the compiled
#   module for empty ones for the call, so Dynamo neither traces those hooks
#   nor guards on them, and fires them for the compiled module at the call's
#   boundary, as Module._call_impl would: trackers attribute down to the
#   compiled module, as with a module they cannot see into;
# - replaces each mode by one that ignores compile internals and forwards
#   every op to it: Dynamo compiles with the modes off, and the backend's
#   forward graph, run under the user's mode, runs under them. The backward
#   graph runs under the trackers themselves.
# So a tracker sees the graphs a fake call runs (what the compiled forward
# saves for backward, what backward recomputes), the figures of the compiled
# run. Compilation also puts higher-order ops where eager calls ops
# (invoke_subgraph for nested_compile_region, auto_functionalized for ops
# that mutate inputs, with_effects for effectful ops); trackers have no rule
# for them (MemTracker raises, FlopCounterMode counts nothing inside), so
# graphs that run under trackers call those ops' own implementation (their
# CompositeExplicitAutograd kernel) and the trackers see the ops inside, as
# the compiled code runs them. Other higher-order ops (control flow) reach the
# trackers as in eager. Other modes (which may change what ops return),
# backward module hooks (CommDebugMode's module tracker installs a global
# one), global forward or forward pre-hooks other than those of
# ModuleTracker and ModTracker themselves (not subclasses: they may change
# results), calls that compile nothing (set_stance("force_eager"), run-only
# calls) and calls without a user's FakeTensorMode keep the frames skipped,
# as on stock.


class _ObservingCompiledRun(_python_dispatch.TorchDispatchMode):
    """An observing mode, presented to Dynamo as ignoring compile internals."""

    supports_higher_order_operators = True

    def __init__(self, mode: Any) -> None:
        super().__init__()
        self.mode = mode

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if isinstance(func, torch._ops.HigherOrderOperator):
            kernel = _kernels_of_compile_only_hops().get(func.name())
            if kernel is not None:
                # One that another calls (auto_functionalized_v2 of an
                # invoke_subgraph); graph_for_observers rewrote the others.
                with self:
                    return kernel(*args, **(kwargs or {}))
            if not getattr(self.mode, "supports_higher_order_operators", False):
                raise NotImplementedError(
                    f"There was no rule registered for HigherOrderOperator "
                    f"{func.name()} and mode {self.mode}."
                )
        return self.mode.__torch_dispatch__(func, types, args, kwargs)


def observers_of_compiled_call(
    fn: Callable[..., Any], callback: Any
) -> Optional[list[Any]]:
    """
    The dispatch modes (bottom first) a call of compiled fn under a user's
    FakeTensorMode shows the compiled run to (see Note [Trackers see the
    compiled run of a fake call]), or None: a call that compiles nothing
    (set_stance("force_eager"), run-only), no user's FakeTensorMode, no mode
    to present, a mode that may change results, backward module hooks, or a
    global forward hook not a module tracker's (it may change results).
    """
    # Made by callback_for_fake_calls for a call under a user's FakeTensorMode.
    if type(callback) is not fake_mode_guards.FakeCallsCallback:
        return None
    modes = [
        mode
        for mode in _python_dispatch._get_current_dispatch_mode_stack()
        if not mode.is_infra_mode()
    ]
    observers = [mode for mode in modes if not type(mode).ignore_compile_internals()]
    if not observers or not all(_only_observes(mode) for mode in observers):
        return None
    hooks = torch.nn.modules.module
    module = _module_of(fn)
    if (
        hooks._global_backward_pre_hooks
        or hooks._global_backward_hooks
        or (module is not None and (module._backward_pre_hooks or module._backward_hooks))
        or not all(
            _is_a_module_trackers(hook)
            for hook in (
                *hooks._global_forward_pre_hooks.values(),
                *hooks._global_forward_hooks.values(),
            )
        )
    ):
        return None
    return modes


def _is_a_module_trackers(hook: Callable[..., Any]) -> bool:
    """
    Whether hook is a method of the module trackers that trackers use
    (FlopCounterMode's ModuleTracker, MemTracker's ModTracker): it records
    which module runs, and changes nothing.
    """
    owner = getattr(hook, "__self__", None)
    # Not imported: none of its hooks is registered (no import here: Dynamo's
    # callback may be set around this call).
    for module_name, class_name in (
        ("torch.utils.module_tracker", "ModuleTracker"),
        ("torch.distributed._tools.mod_tracker", "ModTracker"),
    ):
        # Exactly: a subclass may change results.
        tracker_module = sys.modules.get(module_name)
        if tracker_module is not None and type(owner) is getattr(
            tracker_module, class_name
        ):
            return True
    return False


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


def runs_under_observers() -> bool:
    """
    Whether a graph runs under a tracker shown the compiled run: its forward
    under the modes presenting trackers, its backward under the trackers.
    """
    return any(
        isinstance(mode, _ObservingCompiledRun) or _only_observes(mode)
        for mode in _python_dispatch._get_current_dispatch_mode_stack()
    )


@functools.cache
def _kernels_of_compile_only_hops() -> dict[str, Callable[..., Any]]:
    """The higher-order ops only compiled graphs call, by name, to their own kernels."""
    from torch._higher_order_ops.auto_functionalize import (
        auto_functionalized,
        auto_functionalized_v2,
    )
    from torch._higher_order_ops.effects import with_effects
    from torch._higher_order_ops.invoke_subgraph import invoke_subgraph

    kernels = {
        hop.name(): hop.py_kernels[torch._C.DispatchKey.CompositeExplicitAutograd]
        for hop in (auto_functionalized, auto_functionalized_v2, with_effects)
    }
    # Its kernel calls the subgraph, asserting that no mode is active.
    kernels[invoke_subgraph.name()] = _call_subgraph
    return kernels


def _call_subgraph(subgraph: Any, identifier: Any, *operands: Any) -> Any:
    if getattr(subgraph, "_boxed_call", False):
        return subgraph(list(operands))
    return subgraph(*operands)


def _call_kernel(hop_name: str, *args: Any, **kwargs: Any) -> Any:
    return _kernels_of_compile_only_hops()[hop_name](*args, **kwargs)


def graph_for_observers(gm: fx.GraphModule) -> Optional[fx.GraphModule]:
    """
    A copy of gm in which the higher-order ops only compiled graphs call (in gm
    and the subgraphs it calls) call their kernels instead, or None when gm
    calls none (see Note [Trackers see the compiled run of a fake call]).
    Graphs are copied; tensors and other attributes are shared.
    """
    kernels = _kernels_of_compile_only_hops()
    copies: dict[int, Optional[fx.GraphModule]] = {}

    def calls_compile_only_hop(node: fx.Node) -> bool:
        return (
            node.op == "call_function"
            and isinstance(node.target, torch._ops.HigherOrderOperator)
            and node.target.name() in kernels
        )

    def rewritten(module: fx.GraphModule) -> Optional[fx.GraphModule]:
        if id(module) in copies:
            return copies[id(module)]
        subgraphs = {}
        for node in module.graph.nodes:
            if node.op == "get_attr":
                attr = _get_attr(module, node.target)
                if isinstance(attr, fx.GraphModule) and (sub := rewritten(attr)):
                    subgraphs[node.target] = sub
        observed = None
        if subgraphs or any(map(calls_compile_only_hop, module.graph.nodes)):
            observed = fx.GraphModule(module, copy.deepcopy(module.graph))
            for target, sub in subgraphs.items():
                observed.add_submodule(target, sub)
            for node in filter(calls_compile_only_hop, observed.graph.nodes):
                node.args = (node.target.name(), *node.args)
                node.target = _call_kernel
            observed.recompile()
        copies[id(module)] = observed
        return observed

    return rewritten(gm)


def _module_of(fn: Callable[..., Any]) -> Optional[torch.nn.Module]:
    """
    The module whose call, hooks included, fn is: Module.compile() compiles
    its _call_impl, torch.compile(module) its module's __call__ (both through
    external_utils.wrap_inline for modules Dynamo would skip).
    """
    fn = getattr(fn, "__wrapped__", fn)
    if isinstance(fn, torch.nn.Module):
        return fn
    module = getattr(fn, "__self__", None)
    if isinstance(module, torch.nn.Module) and getattr(fn, "__func__", None) in (
        torch.nn.Module._call_impl,
        torch.nn.Module._wrapped_call_impl,
    ):
        return module
    return None


def call_observed(
    fn: Callable[..., Any], args: Any, kwargs: Any, modes: list[Any]
) -> Any:
    """
    fn(*args, **kwargs), called with Dynamo's callback set, the forward hooks
    of every module and of fn's module lifted out and fired for fn's module
    at the call's boundary, as Module._call_impl fires them, and modes (the
    top dispatch modes, bottom first) presented as ignoring compile
    internals. See Note [Trackers see the compiled run of a fake call]
    """
    # The hooks and the swap of modes run outside Dynamo. The global hook
    # dicts are process-wide: observed calls on two threads would swap them
    # in turn and restore them out of order.
    callback = set_eval_frame(None)
    try:
        with _observed_calls_lock, _LiftedForwardHooks(_module_of(fn)) as hooks:
            result = None
            try:
                args, kwargs = hooks.fire_pre_hooks(args, kwargs)
                with _PresentedAsIgnoringCompileInternals(len(modes)):
                    set_eval_frame(callback)
                    try:
                        result = fn(*args, **kwargs)
                    finally:
                        set_eval_frame(None)
                return hooks.fire_post_hooks(args, kwargs, result)
            except Exception:
                hooks.fire_always_called_hooks(args, kwargs, result)
                raise
    finally:
        set_eval_frame(callback)


_observed_calls_lock = threading.RLock()


class _LiftedForwardHooks:
    """
    The global forward hooks and those of a module, fired for the module in
    the order Module._call_impl fires them (none without a module). While
    entered, their dicts are swapped for empty ones: handles keep removing
    hooks from the dicts they were registered in, and hooks registered
    meanwhile join them on exit.
    """

    _GLOBAL = (
        "_global_forward_pre_hooks",
        "_global_forward_hooks",
        "_global_forward_hooks_with_kwargs",
        "_global_forward_hooks_always_called",
    )
    _MODULE = (
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
    )

    def __init__(self, module: Optional[torch.nn.Module]) -> None:
        self.module = module
        self.owners: list[tuple[Any, str]] = [
            (torch.nn.modules.module, name) for name in self._GLOBAL
        ]
        if module is not None:
            self.owners += [(module, name) for name in self._MODULE]
        self.dicts = [getattr(owner, name) for owner, name in self.owners]
        (
            self.global_pre,
            self.global_post,
            self.global_with_kwargs,
            self.global_always_called,
        ) = self.dicts[:4]
        self.pre, self.pre_with_kwargs, self.post, self.with_kwargs, self.always_called = (
            self.dicts[4:] if module is not None else ({},) * 5
        )
        self.called: set[int] = set()

    def __enter__(self) -> "_LiftedForwardHooks":
        for owner, name in self.owners:
            setattr(owner, name, type(getattr(owner, name))())
        return self

    def __exit__(self, *exc: Any) -> None:
        for (owner, name), hook_dict in zip(self.owners, self.dicts):
            hook_dict.update(getattr(owner, name))
            setattr(owner, name, hook_dict)

    def fire_pre_hooks(self, args: Any, kwargs: Any) -> tuple[Any, Any]:
        if self.module is None:
            return args, kwargs
        for hook_id, hook in (*self.global_pre.items(), *self.pre.items()):
            if hook_id in self.pre_with_kwargs:
                new = hook(self.module, args, kwargs)
                if new is not None:
                    args, kwargs = new
            else:
                new = hook(self.module, args)
                if new is not None:
                    args = new if isinstance(new, tuple) else (new,)
        return args, kwargs

    def _post_hooks(self) -> list[tuple[int, Any, bool, bool]]:
        if self.module is None:
            return []
        return [
            (hook_id, hook, hook_id in with_kwargs, hook_id in always_called)
            for post, with_kwargs, always_called in (
                (self.global_post, self.global_with_kwargs, self.global_always_called),
                (self.post, self.with_kwargs, self.always_called),
            )
            for hook_id, hook in list(post.items())
        ]

    def _fire(self, hook: Any, with_kwargs: bool, args: Any, kwargs: Any, result: Any) -> Any:
        if with_kwargs:
            return hook(self.module, args, kwargs, result)
        return hook(self.module, args, result)

    def fire_post_hooks(self, args: Any, kwargs: Any, result: Any) -> Any:
        for hook_id, hook, with_kwargs, _ in self._post_hooks():
            self.called.add(hook_id)
            new = self._fire(hook, with_kwargs, args, kwargs, result)
            if new is not None:
                result = new
        return result

    def fire_always_called_hooks(self, args: Any, kwargs: Any, result: Any) -> None:
        # As Module._call_impl does when forward raises: their errors become
        # warnings, the forward's error propagates.
        for hook_id, hook, with_kwargs, always_called in self._post_hooks():
            if always_called and hook_id not in self.called:
                try:
                    self._fire(hook, with_kwargs, args, kwargs, result)
                except Exception as e:
                    warnings.warn(
                        "module forward hook with ``always_call=True`` raised an "
                        "exception that was silenced as another error was raised "
                        f"in forward: {e}",
                        stacklevel=2,
                    )


class _PresentedAsIgnoringCompileInternals:
    """Replaces the top n dispatch modes by _ObservingCompiledRun ones."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self) -> None:
        self.modes = [_python_dispatch._pop_mode() for _ in range(self.n)][::-1]
        for mode in self.modes:
            _python_dispatch._push_mode(_ObservingCompiledRun(mode))
        self.flag = _python_dispatch._is_in_any_mode_without_ignore_compile_internals
        _python_dispatch._is_in_any_mode_without_ignore_compile_internals = False
        set_is_in_mode_without_ignore_compile_internals(False)

    def __exit__(self, *exc: Any) -> None:
        for _ in self.modes:
            _python_dispatch._pop_mode()
        for mode in self.modes:
            _python_dispatch._push_mode(mode)
        _python_dispatch._is_in_any_mode_without_ignore_compile_internals = self.flag
        set_is_in_mode_without_ignore_compile_internals(self.flag)
