"""The one setting of pola_mm's implementations, read by the ops only.

Each op in :mod:`pola_mm.ops` is one public function with its plain
PyTorch reference beside it (``polarity_attention`` and
``polarity_attention_pytorch``, ...). The op picks between its fast
implementation and the reference itself, from the tensors it is given;
the models call the op and never see a flag. The attention ops have three
implementations each, and :func:`implementation` is the one rule that
picks among them:

- ``'triton'``: fused kernels (CUDA GPUs that :func:`~.launch.device_admits`,
  and ``meta`` / fake CUDA tensors);
- ``'cpu'``: torch operations rearranged (any device);
- ``'graph'``: the reference in standard operations.

One setting caps the choice, from the environment variable ``POLA_MM_OPS``
(read at import) or, for a block of code, ``with
pola_mm.ops.use_implementation(name):`` (process-wide, not per thread):

- ``auto`` (the default): the fastest implementation that runs here;
- ``triton``: as ``auto``, and the kernels also on CPU tensors while
  Triton's interpreter is on (``TRITON_INTERPRET=1``; tests);
- ``cpu``: no Triton kernel (the other fast paths stay on);
- ``graph``: every op runs its plain reference.

While a graph is exported (``torch.export``, ONNX export, tracing,
``torch.fx``) every op runs its reference, written in standard operations;
under ``torch.compile`` the attention ops keep their kernels (opaque custom
ops of the graph) and the other ops run their references.
"""
import contextlib
import importlib.util
import os
from typing import Callable, Iterator, Optional

import torch
from torch import Tensor

from .launch import device_admits, interpreted, usable

__all__ = [
    'IMPLEMENTATION_ENV', 'IMPLEMENTATIONS', 'get_implementation',
    'set_implementation', 'use_implementation', 'is_compiling', 'exporting',
    'capturing', 'use_fast', 'records_grad', 'DynamicShapeExportError',
    'triton_available', 'implementation'
]

#: The environment variable of the setting.
IMPLEMENTATION_ENV = 'POLA_MM_OPS'
#: Its values.
IMPLEMENTATIONS = ('auto', 'triton', 'cpu', 'graph')
#: The settings of earlier versions, with what replaces them.
_OLD_ENV = {
    'POLA_MM_FAST_PATHS': 'POLA_MM_OPS=graph',
    'POLA_MM_KERNELS': 'POLA_MM_OPS=cpu',
}
_OLD_NAMES = {
    'plain_paths': "use_implementation('graph')",
    'no_kernels': "use_implementation('cpu')",
    'set_fast_paths': "set_implementation('graph' or 'auto')",
    'set_kernels': "set_implementation('cpu' or 'auto')",
    'fast_paths_enabled': "get_implementation() != 'graph'",
    'kernels_enabled': "get_implementation() in ('auto', 'triton')",
    'FAST_PATHS_ENV': 'IMPLEMENTATION_ENV',
    'KERNELS_ENV': 'IMPLEMENTATION_ENV',
}


def old_name(module: str, name: str) -> AttributeError:
    """The one-line error of a name of an earlier version (the module's
    ``__getattr__``)."""
    if name in _OLD_NAMES:
        return AttributeError(f'{module}.{name} was replaced by '
                              f'pola_mm.ops.{_OLD_NAMES[name]}')
    return AttributeError(f'module {module!r} has no attribute {name!r}')


def __getattr__(name: str):
    raise old_name(__name__, name)


def _checked(name: str, source: str) -> str:
    value = str(name).strip().lower()
    if value not in IMPLEMENTATIONS:
        raise ValueError(f'{source}={name!r}: use one of '
                         f'{", ".join(IMPLEMENTATIONS)}')
    return value


def _from_environment() -> str:
    for old, new in _OLD_ENV.items():
        if old in os.environ:
            raise RuntimeError(f'{old} is no longer read: set {new} '
                               f'(or unset {old})')
    return _checked(os.environ.get(IMPLEMENTATION_ENV, 'auto'),
                    IMPLEMENTATION_ENV)


_setting = _from_environment()


def get_implementation() -> str:
    """The setting: one of :data:`IMPLEMENTATIONS`."""
    return _setting


def set_implementation(name: str) -> None:
    """Set the setting for the whole process (one of
    :data:`IMPLEMENTATIONS`; ValueError otherwise)."""
    global _setting
    _setting = _checked(name, 'set_implementation')


@contextlib.contextmanager
def use_implementation(name: str) -> Iterator[None]:
    """Run a block with the setting ``name`` (one of
    :data:`IMPLEMENTATIONS`); the previous one is restored on exit."""
    previous = _setting
    set_implementation(name)
    try:
        yield
    finally:
        set_implementation(previous)


class DynamicShapeExportError(RuntimeError):
    """A part of a model that an exporter can only capture at one input
    size was asked for a dynamic size: the export is refused (no file that
    would compute something else at another size); the message names the
    exporter settings that work.

    ``last`` holds the message of the latest one raised: an exporter that
    falls back to another capture strategy may swallow the exception
    itself, and the export tool still names the refusal."""

    last = None

    def __init__(self, *args) -> None:
        super().__init__(*args)
        DynamicShapeExportError.last = str(self)


_is_compiling = getattr(getattr(torch, 'compiler', None), 'is_compiling',
                        None)  # torch >= 2.3
_is_exporting = getattr(getattr(torch, 'compiler', None), 'is_exporting',
                        None)  # torch >= 2.5


def is_compiling() -> bool:
    """Whether ``torch.compile`` is tracing."""
    return bool(_is_compiling()) if _is_compiling is not None else False


def exporting() -> bool:
    """Whether a graph is being captured for export: ``torch.jit.trace``
    (the TorchScript ONNX exporter), ``torch.export`` or the dynamo ONNX
    exporter."""
    if torch.jit.is_tracing():
        return True
    return bool(_is_exporting()) if _is_exporting is not None else False


def capturing() -> bool:
    """Whether any graph is being captured (:func:`is_compiling` or
    :func:`exporting`)."""
    return is_compiling() or exporting()


def use_fast(x: Tensor) -> bool:
    """Whether an op called on ``x`` may run its fast implementation: the
    setting is not ``graph`` and no graph is captured (``x`` is no
    ``torch.fx`` proxy)."""
    return (_setting != 'graph' and not isinstance(x, torch.fx.Proxy)
            and not capturing())


def records_grad(*tensors) -> bool:
    """Whether autograd records a computation from ``tensors`` (None
    entries ignored)."""
    return torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in tensors)


_TRITON = (importlib.util.find_spec('triton') is not None
           and hasattr(torch.library, 'custom_op'))


def triton_available() -> bool:
    """Whether Triton is installed and torch registers custom ops
    (``torch.library.custom_op``, torch >= 2.4)."""
    return _TRITON


def _kernel_device(x: Tensor) -> bool:
    """Whether ``x`` lives where the kernels run: a CUDA GPU with Triton
    that :func:`~.launch.device_admits`, or a tensor without values that
    stands for one (``meta``, fake CUDA: memory estimates and structure
    tests see what a GPU runs); with the setting ``triton``, also a CPU
    tensor while Triton's interpreter is on."""
    if not hasattr(torch.library, 'custom_op'):  # torch < 2.4
        return False
    if x.device.type == 'meta':
        return True
    if x.device.type == 'cpu':
        return (_setting == 'triton' and triton_available()
                and interpreted())
    if x.device.type != 'cuda':
        return False
    from torch._subclasses.fake_tensor import is_fake
    if is_fake(x) or not torch.cuda.is_available():
        return True
    return triton_available() and device_admits(x.device)


def implementation(x: Tensor, kernel_fits: bool, cpu_fits: bool = True,
                   config: Optional[tuple] = None,
                   probe: Optional[Callable[[tuple], None]] = None) -> str:
    """The implementation an attention op runs on its input ``x``
    (``config``: the kernels' configuration of this input; ``probe`` runs
    it once, see :func:`~.launch.usable`).

    - ``'graph'`` (the reference, standard operations) while a graph is
      exported, with the setting ``graph``, and where neither fast path
      fits; under ``torch.compile`` where the kernels do not run;
    - ``'triton'`` (fused kernels) where ``kernel_fits`` (the op's kernels
      take these shapes and dtypes and have not failed here), the setting
      allows them and ``x`` is on a kernel device (:func:`_kernel_device`),
      also under ``torch.compile``: each launch is a custom op, opaque in
      the compiled graph;
    - ``'cpu'`` (torch operations, any device) otherwise, where
      ``cpu_fits``.
    """
    if (_setting == 'graph' or isinstance(x, torch.fx.Proxy)
            or exporting()):
        return 'graph'
    if (kernel_fits and _setting in ('auto', 'triton') and _kernel_device(x)
            and (config is None or usable(config, probe))):
        return 'triton'
    return 'cpu' if cpu_fits and not is_compiling() else 'graph'
