"""
Trackers (dispatch modes that only observe) around compiled code called under
a user's FakeTensorMode see the compiled run, attributed to modules as eager
attributes it, from the graphs' own metadata. See Note [Trackers see the
compiled run of a fake call].
"""

import functools
import logging
import sys
from typing import Any, Callable, Optional

import torch
from torch import fx
from torch.utils import _python_dispatch, _pytree as pytree

from . import fake_mode_compat, fake_mode_guards
from .ambient_fake_mode import tracer_owns_call, users_fake_mode
from .fake_mode_attribution import (
    _current_graph_call,
    _enter,
    _leave,
    _module_tracker_types,
    _module_trackers,
    _observed,
    _only_observes,
    _warn_once,
)
from .types import ConvertFrameReturn, FrameAction, FrameExecStrategy


log = logging.getLogger(__name__)
_logged = False


def frames_run_eagerly_under_modes() -> bool:
    """
    Whether a fullgraph=True call that compiled no frame ran them eagerly on
    purpose: under a user's FakeTensorMode, a dispatch mode that may change
    results (or that this code cannot show the compiled run) makes Dynamo
    skip frames, which run eagerly under the modes, as on stock. That eager
    run is what the call is for (an estimate): fullgraph=True does not fail
    with "found no compiled frames" for it.
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
# people make it under trackers: FlopCounterMode, MemTracker. Their tables
# are per module: a module tracker (ModuleTracker, ModTracker) learns which
# module runs from global module forward hooks and from gradient hooks on the
# modules' inputs and outputs. Dynamo skips frames under a dispatch mode, and
# cannot trace those hooks anyway. These modes declare that they only observe
# (_only_observes, on the class implementing __torch_dispatch__). Under a
# user's FakeTensorMode, when every mode on the stack only observes or
# ignores compile internals, and every global forward hook is a module
# tracker's, a call of compiled code is made on its own cache entries
# (FakeCallsCallback(observed=True)) and, on this thread only, for its
# duration (shows_compiled_run()):
# - the trackers ignore compile internals (their ignore_compile_internals):
#   Dynamo compiles the frames with the modes off, as for any such mode, and
#   the graphs the backend builds run under them;
# - Dynamo traces as if no global forward hook were registered
#   (hidden_from_tracing, read by VariableTracker.build): the module
#   trackers' hooks are neither traced nor guarded on. Hooks that run
#   outside Dynamo (the compiled module's own call, Module._call_impl, which
#   Dynamo skips; frames after a graph break) fire as in eager.
# The graphs say which module each op comes from: a forward node's
# nn_module_stack, a backward node's fwd_nn_module_stack (AOTAutograd copies
# it by seq_nr), a recomputed node's own. The graphs shown to trackers cross
# module boundaries where that stack changes (graph_for_observers): the
# module trackers on this thread's mode stack enter and leave the modules,
# resolved to the module objects of this call (_GraphCall, from the compiled
# frame's locals and globals; the backward finds its call on its autograd
# node). So FlopCounterMode and MemTracker build eager's rows with the
# compiled run's figures: what the forward saves (MemTracker's activations),
# what the backward recomputes, attributed to the module whose op it is;
# MemTracker books parameters, buffers and gradients per module as in eager
# (its module pre-hook tracks them and hooks the gradients).
# Compilation also puts higher-order ops where eager calls ops
# (invoke_subgraph for nested_compile_region, auto_functionalized for ops
# that mutate inputs, with_effects for effectful ops); trackers have no rule
# for them, so graphs shown to trackers call those ops' own implementation
# (their CompositeExplicitAutograd kernel) and the trackers see the ops
# inside. So do pointwise prims (Dynamo writes addcmul_ as prims.fma) where
# the backend runs the graph as it is (not Inductor's kernels): the real
# run's kernel runs the prim's reference implementation, whose temporaries
# a FakeTensor's meta function does not make. Other modes (which may change
# what ops return, or whose module tracking this code does not drive:
# CommDebugMode's backward hooks), global
# backward hooks, global forward hooks that are not a module tracker's, calls
# that compile nothing (set_stance("force_eager")) and calls without a user's
# FakeTensorMode keep the frames skipped, as on stock: the frames run
# eagerly under the modes, with one warning saying why.


def shows_compiled_run() -> bool:
    """
    Whether this thread is in a fake call that shows trackers the compiled
    run: the trackers' ignore_compile_internals() while it is.
    """
    return _observed.depth > 0


def for_observed_calls(
    callback: Any, fn: Callable[..., Any]
) -> tuple[Any, Callable[..., Any]]:
    """
    The callback for a call of fn, compiled code, under a user's
    FakeTensorMode (callback, made by for_call_under_modes), and what
    compile_wrapper calls: the call shown to trackers, if the modes on the
    stack allow it (see Note [Trackers see the compiled run of a fake call]).
    """
    why = _why_not_shown()
    if why is None:
        return ObservedCallsCallback(callback.callback), functools.partial(
            call_observed, fn
        )
    if why:
        _warn_once(
            "A compiled call under a FakeTensorMode and a dispatch mode runs "
            f"eagerly under the modes, as on stock (the modes see eager's run): {why}"
        )
    return callback, fn


class ObservedCallsCallback(fake_mode_guards.FakeCallsCallback):
    """
    Compiles as FakeCallsCallback, on entries of calls shown to trackers. The
    trackers' own code (their module hooks, which modules called outside
    Dynamo's graphs fire, and their optimizer hooks) runs eagerly, with all
    it calls: it is their bookkeeping, not the model's.
    """

    def __init__(self, callback: Any) -> None:
        super().__init__(callback, observed=True)

    def __call__(self, frame: Any, cache_entry: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(
            torch._dynamo.config, "nested_graph_breaks", False
        ) and frame.f_code.co_name.startswith("torch_dynamo_resume_in_"):
            _warn_once(
                "Trackers shown a compiled call under a FakeTensorMode: with "
                "torch._dynamo.config.nested_graph_breaks, the modules around a "
                "graph break inside a nested call are not entered after it"
            )
        caller, files = frame, _tracker_files()
        for _ in range(8):
            if caller is None:
                break
            if caller.f_code.co_filename in files:
                return ConvertFrameReturn(
                    frame_exec_strategy=FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP),
                    apply_to_code=False,
                )
            caller = caller.f_back
        return super().__call__(frame, cache_entry, *args, **kwargs)


def _tracker_files() -> set[str]:
    return {
        sys.modules[name].__file__
        for name in (
            "torch.utils.module_tracker",
            "torch.utils.flop_counter",
            "torch.distributed._tools.mod_tracker",
            "torch.distributed._tools.mem_tracker",
            "torch.distributed._tools.fsdp2_mem_tracker",
        )
        if name in sys.modules
    }


def _why_not_shown() -> Optional[str]:
    """None if the call can show the modes the compiled run, else why not
    ('' when no mode would want it)."""
    if _observed.depth:
        # A call inside one shown to the trackers.
        return None
    modes = [
        mode
        for mode in _python_dispatch._get_current_dispatch_mode_stack()
        if not mode.is_infra_mode() and not type(mode).ignore_compile_internals()
    ]
    if not modes:
        return ""
    for mode in modes:
        if not _only_observes(mode):
            return (
                f"{type(mode).__name__} may change what ops return, or tracks "
                "modules in a way this code does not drive"
            )
    hooks = torch.nn.modules.module
    if hooks._global_backward_pre_hooks or hooks._global_backward_hooks:
        return "a global module backward hook is registered"
    for hook in (
        *hooks._global_forward_pre_hooks.values(),
        *hooks._global_forward_hooks.values(),
    ):
        tracker = _module_tracker_of_hook(hook)
        if tracker is None:
            return (
                f"the global module forward hook {getattr(hook, '__qualname__', hook)} "
                "may change results"
            )
        # A ModTracker calls back whoever registered user hooks: only a
        # tracker's (MemTracker's) are driven from the graphs.
        for user_hook in (
            getattr(tracker, f"_user_{kind}_hook", None)
            for kind in ("pre_fw", "post_fw", "pre_bw", "post_bw")
        ):
            if user_hook is not None and not _only_observes(
                getattr(user_hook, "__self__", None)
            ):
                return (
                    f"a ModTracker calls back {getattr(user_hook, '__qualname__', user_hook)}, "
                    "which sees modules only when they run eagerly"
                )
    return None


def _module_tracker_of_hook(hook: Callable[..., Any]) -> Optional[Any]:
    """The module tracker (ModuleTracker, ModTracker: they record which
    module runs, and change nothing) whose method hook is, if any."""
    owner = getattr(hook, "__self__", None)
    return owner if type(owner) in _module_tracker_types() else None


def call_observed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs), shown to the trackers on this thread's stack."""
    # The compiled module enters here, as its hooks would in eager, for the
    # module trackers that do not see it: all of them where Dynamo traces
    # its call (external_utils.wrap_inline, for modules it would skip),
    # ModTracker inside torch.compile(module) (its hooks return early there).
    # The modules inside enter from the graphs.
    module = _module_of(fn)
    trackers = []
    if module is not None:
        inlined = hasattr(fn, "__wrapped__")
        in_optimized_module = torch._dynamo.eval_frame._is_in_optimized_module()
        trackers = [
            t
            for t in _module_trackers()
            if inlined or (in_optimized_module and hasattr(t, "_user_pre_fw_hook"))
        ]
    hooks = torch.is_grad_enabled()
    for tracker in trackers:
        _enter(tracker, module, False, hooks, args)
    _observed.depth += 1
    _observed.entered_modules.append(module if trackers else None)
    try:
        result = fn(*args, **kwargs)
    finally:
        _observed.depth -= 1
        _observed.entered_modules.pop()
    outputs = tuple(pytree.tree_leaves(result))
    for tracker in reversed(trackers):
        _leave(tracker, module, False, hooks, outputs)
    return result


def _module_of(fn: Callable[..., Any]) -> Optional[torch.nn.Module]:
    """The module whose call fn is (torch.compile(module) compiles its
    __call__, through external_utils.wrap_inline for modules Dynamo skips)."""
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


def skips_module_call(tracker: Any, module: Any) -> bool:
    """
    Whether a module tracker does not count a call of module on this thread
    as a module running: a call of a graph's own subgraph by a graph shown to
    trackers; inside a fake call shown to trackers, a tracer's call (Dynamo
    compiling, AOTAutograd or make_fx tracing graph modules); and a call on a
    thread making fake calls under trackers of its own, if tracker is
    another tracker mode's (FlopCounterMode's, MemTracker's: their hooks are
    global), inside such a call or for the torch.compile(module) wrapper's
    call that makes it.
    """
    if isinstance(module, fx.GraphModule) and _current_graph_call() is not None:
        return True
    if _observed.depth and tracer_owns_call():
        return True
    if not getattr(tracker, "_owned_by_a_tracker", False):
        return False
    if _observed.depth or (
        isinstance(module, torch._dynamo.eval_frame.OptimizedModule)
        and users_fake_mode() is not None
    ):
        mine = _module_trackers()
        return bool(mine) and all(t is not tracker for t in mine)
    return False


def hidden_from_tracing(value: Any) -> bool:
    """Whether Dynamo traces value, a global forward hook dict, as empty."""
    if not _observed.depth:
        return False
    hooks = torch.nn.modules.module
    return any(
        value is hook_dict
        for hook_dict in (
            hooks._global_forward_pre_hooks,
            hooks._global_forward_hooks,
            hooks._global_forward_hooks_with_kwargs,
            hooks._global_forward_hooks_always_called,
        )
    )
