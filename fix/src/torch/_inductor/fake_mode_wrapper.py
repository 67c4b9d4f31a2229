"""
Inductor's compile of a graph Dynamo compiled for calls under a user's
FakeTensorMode, when config.fake_mode_plans_inductor_buffers is set: the
graph is lowered, fused and scheduled as for the real run, and the Python
wrapper Inductor generates runs under the user's mode with no kernel
compiled. See Note [Inductor's buffers in a fake call].
"""

import ast
import builtins
import contextlib
import logging
import sys
import threading
import types
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Optional

import torch

from .fake_mode_wrapper_instrumentation import collecting_planned_peaks, instrument


log = logging.getLogger(__name__)


# Note [Inductor's buffers in a fake call]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A fake call must predict the memory of the compiled run, and Inductor's
# run allocates less than its graphs: it fuses pointwise ops into kernels
# that write into buffers it allocates, reuses the buffers of dead tensors
# and writes in place. All of it is in the wrapper code it generates (the
# `call` function: allocations, kernel calls, extern kernels, `del`s), so a
# fake call runs that code, as generated for the real run: compile_fx_inner
# lowers and schedules the graph as always, and only the wrapper module is
# loaded differently (GraphLowering asks code_loader()):
#   - the module is a private one, never in PyCodeCache or sys.modules, so a
#     later real compile of the same code loads and compiles it anew;
#   - its AsyncCompile compiles nothing: every kernel is a no-op, so the
#     buffers it would write keep their metadata, which is all a FakeTensor
#     has. Extern kernels (mm, convolution, fallbacks, custom ops) are ops
#     and run under the FakeTensorMode as in eager;
#   - the allocation helpers, which bypass the dispatcher in C++, allocate
#     through it (torch.empty_strided; reinterpret_tensor as an alias that is
#     not a view, as the C++ one), so the user's FakeTensorMode makes
#     FakeTensors and trackers see each buffer;
#   - a CUDA wrapper's device guards, kernel streams, events and input
#     realignment touch no device (its compile reads the device's properties
#     and may run ops on it, as a real compile does; streams and memory pools
#     of the user's are the user's). Where the realignment is not the
#     wrapper's but Python's around it (releases before 2.12, mutated
#     inputs), it reads a FakeTensor's address, 0: a misaligned view is not
#     copied there, where the real run copies it.
# What runs is Inductor's own plan: no copy of its memory planning. A CUDA
# graph is planned as for the GPU the process sees (Inductor reads its
# properties while it lowers and generates code; a machine without one
# stops before, see _missing_device in torch/_dynamo/fake_mode_backend_graphs.py).
# The FX graph cache (whose artifact would be loaded with its kernels), the
# C++ wrapper, CUDA graphs (and their graph partitions) and the process pool
# (it compiles Triton kernels while they are generated) are off for such a
# compile (config.patch: for the process, while it compiles). Where the wrapper
# cannot run on FakeTensors the graph runs unlowered, with a warning: other
# devices, max-autotune (it loads and benchmarks modules of its own),
# nan_asserts, an out-of-process compile, a wrapper that reads values
# (torch.cond, a 0-dim CPU tensor passed to a Triton kernel). A compile
# whose callable is not the privately loaded wrapper's fails closed the
# same way.
# Trackers shown the compiled run (the trackers patch, torch 2.13 on) see
# each buffer in the module whose op made it: the wrapper crosses module
# boundaries as the graphs shown to them do (see Note [Trackers see the
# compiled run of a fake call] in torch/_dynamo/fake_mode_trackers.py), at
# the statements that allocate or write a buffer, by the module stack of the
# FX node the buffer holds the value of (its origin node); and
# planned_peaks() reports each graph's peak in the plan (see
# fake_mode_wrapper_instrumentation.py, which adds those statements).


class _NoKernel:
    """A kernel that was not compiled: calling it, or launching it, does
    nothing."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def run(self, *args: Any, **kwargs: Any) -> None:
        return None


class _NoKernelCompile:
    """AsyncCompile for a wrapper run under a FakeTensorMode: each kernel it
    is asked for (cpp, cpp_pybinding, triton, ...) is a _NoKernel."""

    def wait(self, scope: dict[str, Any]) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., _NoKernel]:
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: _NoKernel()


_ASYNC_COMPILE = "torch._inductor.async_compile"


def _import(
    name: str,
    globals: Any = None,
    locals: Any = None,
    fromlist: Any = (),
    level: int = 0,
) -> Any:
    # The wrapper imports AsyncCompile from its module: it gets the one
    # that compiles nothing, in this module's namespace only.
    if name == _ASYNC_COMPILE and fromlist and level == 0:
        return types.SimpleNamespace(AsyncCompile=_NoKernelCompile)
    return builtins.__import__(name, globals, locals, fromlist, level)


def _empty_strided(device: str) -> Callable[..., torch.Tensor]:
    def empty_strided(size: Any, stride: Any, dtype: torch.dtype) -> torch.Tensor:
        # On the CUDA device the wrapper selected, as the C++ helper's.
        index = _DEVICE_FREE_TORCH.cuda.index if device == "cuda" else None
        return torch.empty_strided(
            size, stride, dtype=dtype, device=torch.device(device, index)
        )

    return empty_strided


def _reinterpret_tensor(
    tensor: torch.Tensor, size: Any, stride: Any, offset_increment: int = 0
) -> torch.Tensor:
    # An alias of tensor's storage that is not a view and that autograd does
    # not record, as the C++ helper's (set_ to the tensor, not to its
    # storage: trackers see one storage).
    inference = tensor.is_inference() or torch.is_inference_mode_enabled()
    with torch.inference_mode(inference), torch.no_grad():
        alias = torch.empty((0,), dtype=tensor.dtype, device=tensor.device)
        alias.set_(tensor)
        offset = tensor.storage_offset() + offset_increment
        return alias.as_strided_(size, stride, offset)


def _unchecked(*args: Any, **kwargs: Any) -> None:
    return None


def _copy_if_misaligned(tensor: torch.Tensor) -> torch.Tensor:
    # The C++ helper reads the address; a FakeTensor's storage has none, and
    # starts where an allocation of the caching allocator would: aligned. A
    # symbolic offset counts as aligned (no guard is added on it).
    from .utils import ALIGNMENT, clone_preserve_strides

    offset = tensor.storage_offset()
    if isinstance(offset, int) and offset * tensor.element_size() % ALIGNMENT:
        return clone_preserve_strides(tensor)
    return tensor


class _NoEvent:
    """torch.Event in a wrapper run under a FakeTensorMode: no kernel was
    launched to wait for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    record = synchronize = wait = _unchecked

    def query(self) -> bool:
        return True


class _DeviceFreeCuda(threading.local):
    """torch.cuda in a wrapper run under a FakeTensorMode: the device it
    selects is remembered, for the buffers it allocates, and never set (a
    fake call does not initialize CUDA); there is nothing to synchronize."""

    index: Optional[int] = None
    synchronize = staticmethod(_unchecked)

    def set_device(self, index: int) -> None:
        self.index = index

    def current_device(self) -> int:
        if self.index is not None:
            return self.index
        return torch.cuda.current_device() if torch.cuda.is_initialized() else 0

    @contextlib.contextmanager
    def _DeviceGuard(self, index: int) -> Iterator[None]:
        previous, self.index = self.index, index
        try:
            yield
        finally:
            self.index = previous

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class _DeviceFreeTorch:
    """torch, in the scope of a wrapper run under a FakeTensorMode."""

    cuda = _DeviceFreeCuda()
    Event = _NoEvent

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


_DEVICE_FREE_TORCH = _DeviceFreeTorch()


class _Planning(threading.local):
    active = False
    # Why the wrapper loaded in this compile cannot run on FakeTensors.
    unusable: Optional[str] = None
    # The wrapper module loaded in this compile, without kernels.
    module: Optional[types.ModuleType] = None


_planning = _Planning()


def load_without_kernels(
    key: str,
    path: str,
    linemap: Optional[list[tuple[int, str]]] = None,
    attrs: Optional[dict[str, Any]] = None,
    **kwargs: Any,
) -> types.ModuleType:
    """
    PyCodeCache.load_by_key_path for a wrapper run under a FakeTensorMode:
    the module at path, with no kernel compiled and allocation helpers that
    dispatch. See Note [Inductor's buffers in a fake call].
    """
    with open(path) as f:
        source = f.read()
    if ".item()" in source:
        # The wrapper reads a tensor's value (a torch.cond predicate).
        _planning.unusable = "its wrapper reads the values of tensors"
    module = types.ModuleType(f"{__name__}.{key}")
    module.__file__ = path
    module.key = key  # type: ignore[attr-defined]
    scope = module.__dict__
    scope["__builtins__"] = {**builtins.__dict__, "__import__": _import}
    tree = ast.parse(source, path)
    from .virtualized import V

    try:
        scope["_fake_mode_attributed"] = instrument(tree, V.graph, scope)
        code = compile(tree, path, "exec", dont_inherit=True)
    except Exception:
        # The wrapper runs as generated: its buffers are the plan's, their
        # modules and planned_peaks() are not.
        log.warning("Inductor's wrapper for a fake call could not be instrumented", exc_info=True)
        scope["_fake_mode_attributed"] = scope["_fake_mode_instrumented"] = False
        code = compile(source, path, "exec", dont_inherit=True)
    exec(code, scope)
    guards = torch._C._dynamo.guards
    # Where the wrapper finds them (names and helpers vary by release).
    realign = [
        helper
        for name in ("copy_if_misaligned", "copy_misaligned")
        if (helper := getattr(guards, name, None)) is not None
    ]
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    for name, value in list(scope.items()):
        if name.startswith("empty_strided_") and name != "empty_strided_p2p":
            scope[name] = _empty_strided(name[len("empty_strided_") :].split("_")[0])
        elif name.startswith("assert_") and value is getattr(guards, name, None):
            # C++ checks of the extern kernels' outputs, which read sizes
            # a ShapeEnv's FakeTensors hold as symbols.
            scope[name] = _unchecked
        elif any(value is helper for helper in realign):
            scope[name] = _copy_if_misaligned
        elif value is not None and value is raw_stream:
            # The stream a kernel would be launched on: none is.
            scope[name] = _unchecked
    scope["torch"] = _DEVICE_FREE_TORCH
    scope["reinterpret_tensor"] = _reinterpret_tensor
    for name, value in (attrs or {}).items():
        setattr(module, name, value)
    _planning.module = module
    return module


def code_loader() -> Callable[..., Any]:
    """How GraphLowering loads the wrapper module it generated."""
    if _planning.active:
        return load_without_kernels
    from .codecache import PyCodeCache

    return PyCodeCache.load_by_key_path


@contextlib.contextmanager
def _wrappers_without_kernels() -> Iterator[None]:
    previous = _planning.active, _planning.unusable, _planning.module
    _planning.active, _planning.unusable, _planning.module = True, None, None
    try:
        yield
    finally:
        _planning.active, _planning.unusable, _planning.module = previous


def _why_not_planned(example_inputs: Sequence[Any]) -> Optional[str]:
    from . import compile_fx, config

    if any(
        isinstance(t, torch.Tensor) and t.device.type not in ("cpu", "cuda")
        for t in example_inputs
    ):
        return "Inductor's buffers are planned for CPU and CUDA graphs only"
    if config.max_autotune or config.max_autotune_gemm or config.max_autotune_pointwise:
        # Autotuning loads and benchmarks modules of its own.
        return "max-autotune benchmarks what it compiles"
    if config.nan_asserts:
        return "nan_asserts reads the buffers' values"
    mode = getattr(compile_fx, "fx_compile_mode", None)
    if (
        (mode is not None and mode.name != "NORMAL")
        or getattr(compile_fx, "fx_compile_async", False)
        or getattr(compile_fx, "fx_compile_progressive", False)
    ):
        return "an out-of-process compile loads the wrapper with its kernels"
    return None


def _runs(compiled: Any, module: types.ModuleType) -> bool:
    """Whether compiled runs the call of module: as its current_callable, or
    through the realignment of its inputs around it (a closure)."""
    function = getattr(compiled, "current_callable", None)
    candidates = [function]
    for cell in getattr(function, "__closure__", None) or ():
        with contextlib.suppress(ValueError):
            candidates.append(cell.cell_contents)
    return any(
        getattr(getattr(c, "__func__", c), "__globals__", None) is module.__dict__
        for c in candidates
    )


def compile_fx_inner_without_kernels(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    run_under_fake_mode: Callable[[Sequence[Any]], Any],
    **kwargs: Any,
) -> Optional[Callable[[list[Any]], Any]]:
    """
    Inductor's inner compile for fake calls: compile_fx_inner, whose wrapper
    module is loaded without kernels. Its calls run under
    run_under_fake_mode(args), the FakeTensorMode of their inputs. None
    (with a warning) where that wrapper cannot run on FakeTensors: the graph
    then runs unlowered.
    """
    from torch._inductor.utils import BoxedBool

    from . import config
    from .compile_fx import compile_fx_inner

    why = _why_not_planned(example_inputs)
    if why is None:
        # What a fake compile cannot use: a cached artifact (loaded with its
        # kernels), the C++ wrapper (it cannot run under a FakeTensorMode),
        # CUDA graphs, a process pool (it compiles Triton kernels while the
        # wrapper is generated).
        kwargs.update(cpp_wrapper=False, cudagraphs=BoxedBool(False))
        with _wrappers_without_kernels(), config.patch(
            {
                "fx_graph_cache": False,
                "fx_graph_remote_cache": False,
                "cpp_wrapper": False,
                "triton.cudagraphs": False,
                "compile_threads": 1,
            }
        ):
            compiled = compile_fx_inner(gm, example_inputs, **kwargs)
            why, module = _planning.unusable, _planning.module
        if why is None and (module is None or not _runs(compiled, module)):
            why = "its wrapper was loaded with its kernels"
    if why is not None:
        log.warning(
            "A graph compiled for calls under a FakeTensorMode runs unlowered, "
            "not as Inductor's wrapper: %s",
            why,
        )
        return None

    assert module is not None
    scope = module.__dict__
    attributed = scope.get("_fake_mode_attributed", False)
    instrumented = scope.get("_fake_mode_instrumented", False)

    def run(args: list[Any]) -> Any:
        # Once per place, as the default warning filter shows them.
        if not attributed and _module_trackers_observe():
            warnings.warn(_UNATTRIBUTED, stacklevel=2)
        if not instrumented and collecting_planned_peaks():
            warnings.warn(_NOT_INSTRUMENTED, stacklevel=2)
        cuda = _DEVICE_FREE_TORCH.cuda
        device = cuda.index
        try:
            with run_under_fake_mode(args):
                return compiled(args)
        finally:
            # The wrapper's guards select devices for its own run only.
            cuda.index = device

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _module_trackers_observe() -> bool:
    # Trackers shown the compiled run (torch 2.13 on): see Note [Trackers
    # see the compiled run of a fake call] in torch/_dynamo/fake_mode_trackers.py.
    observed_graphs = sys.modules.get("torch._dynamo.fake_mode_observed_graphs")
    return observed_graphs is not None and observed_graphs.runs_under_observers()


_NOT_INSTRUMENTED = (
    "planned_peaks(): Inductor's wrapper for a graph compiled for calls under a "
    "FakeTensorMode could not be instrumented, its run is not reported"
)

_UNATTRIBUTED = (
    "Trackers shown a compiled call under a FakeTensorMode with "
    "fake_mode_plans_inductor_buffers: Inductor's wrapper could not be "
    "attributed to modules, its buffers count in the module that calls it"
)
