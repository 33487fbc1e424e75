"""The one switch of pola_mm's fast implementations, read by the ops only.

Each op in :mod:`pola_mm.ops` is one public function with its plain
PyTorch reference beside it (``polarity_attention`` and
``polarity_attention_pytorch``, ...). The op picks between its fast
implementation and the reference itself, from the tensors it is given and
:func:`use_fast`; the models call the op and never see a flag. One switch
turns every fast implementation off:

- ``POLA_MM_FAST_PATHS=0`` in the environment (read at import), or
- ``with pola_mm.ops.plain_paths(): ...`` for a block of code (process-wide,
  not per thread), or :func:`set_fast_paths`.

While a graph is captured (``torch.export``, ONNX export, tracing,
``torch.compile``, ``torch.fx``) every op runs its reference, written in
standard operations: the captured graph holds no custom autograd function
or run sized for one input.

The attention ops have three implementations each (``graph``: the
reference; ``cpu``: torch operations rearranged; ``triton``: fused
kernels), and :func:`implementation` is the one rule that picks among
them. ``POLA_MM_KERNELS=0`` (or :func:`set_kernels`) keeps the fast paths
but leaves the kernels out (the GPU check compares the two so).
"""
import contextlib
import functools
import importlib.util
import os
from typing import Iterator

import torch
from torch import Tensor

from .launch import device_admits

__all__ = [
    'FAST_PATHS_ENV', 'fast_paths_enabled', 'set_fast_paths', 'plain_paths',
    'is_compiling', 'exporting', 'capturing', 'use_fast', 'records_grad',
    'DynamicShapeExportError', 'KERNELS_ENV', 'kernels_enabled',
    'set_kernels', 'no_kernels', 'triton_available', 'implementation'
]

#: Environment variable: ``0`` (or ``false``/``off``/``no``) turns every fast
#: implementation off.
FAST_PATHS_ENV = 'POLA_MM_FAST_PATHS'


def env_enabled(name: str) -> bool:
    """False when the environment variable ``name`` is ``0``/``false``/
    ``off``/``no``."""
    return os.environ.get(name, '1').strip().lower() not in ('0', 'false',
                                                             'off', 'no')


_enabled = env_enabled(FAST_PATHS_ENV)

#: Environment variable: ``0`` leaves the Triton kernels out (the other
#: fast paths stay on).
KERNELS_ENV = 'POLA_MM_KERNELS'

_kernels = env_enabled(KERNELS_ENV)


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


def fast_paths_enabled() -> bool:
    """Whether the fast implementations may run (the switch)."""
    return _enabled


def set_fast_paths(enabled: bool) -> None:
    """Turn every fast implementation on or off for the whole process."""
    global _enabled
    _enabled = bool(enabled)


@contextlib.contextmanager
def plain_paths() -> Iterator[None]:
    """Run a block with every fast implementation off (the plain PyTorch
    references); the previous setting is restored on exit."""
    previous = _enabled
    set_fast_paths(False)
    try:
        yield
    finally:
        set_fast_paths(previous)


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
    switch is on and no graph is captured (``x`` is no ``torch.fx``
    proxy)."""
    return (_enabled and not isinstance(x, torch.fx.Proxy)
            and not capturing())


def records_grad(*tensors) -> bool:
    """Whether autograd records a computation from ``tensors`` (None
    entries ignored)."""
    return torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in tensors)


def kernels_enabled() -> bool:
    """Whether the attention ops may run their Triton kernels."""
    return _kernels


def set_kernels(enabled: bool) -> None:
    """Let the attention ops run their Triton kernels, or not (the whole
    process; the other fast paths are unaffected)."""
    global _kernels
    _kernels = bool(enabled)


@contextlib.contextmanager
def no_kernels() -> Iterator[None]:
    """Run a block without the Triton kernels (the other fast paths stay
    on); the previous setting is restored on exit."""
    previous = _kernels
    set_kernels(False)
    try:
        yield
    finally:
        set_kernels(previous)


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    """Whether Triton is installed and torch registers custom ops
    (``torch.library.custom_op``, torch >= 2.4)."""
    return (importlib.util.find_spec('triton') is not None
            and hasattr(torch.library, 'custom_op'))


def _kernel_device(x: Tensor) -> bool:
    """Whether ``x`` lives where the kernels run: a CUDA GPU with Triton,
    or a tensor without values that stands for one (``meta``, fake CUDA:
    memory estimates and structure tests see what a GPU runs)."""
    if not hasattr(torch.library, 'custom_op'):  # torch < 2.4
        return False
    if x.device.type == 'meta':
        return True
    if x.device.type != 'cuda':
        return False
    from torch._subclasses.fake_tensor import is_fake
    if is_fake(x) or not torch.cuda.is_available():
        return True
    return triton_available() and device_admits(x.device)


def implementation(x: Tensor, kernel_fits: bool,
                   cpu_fits: bool = True) -> str:
    """The implementation an attention op runs on its input ``x``.

    - ``'graph'`` (the reference, standard operations) while a graph is
      captured, with the fast paths off, and where neither fast path fits;
    - ``'triton'`` (fused kernels) on a CUDA GPU with Triton, and on
      ``meta`` and fake CUDA tensors, where ``kernel_fits`` (the op's
      kernels take these shapes and dtypes) and the kernels are on;
    - ``'cpu'`` (torch operations, any device) otherwise, where
      ``cpu_fits``.
    """
    if not use_fast(x):
        return 'graph'
    if kernel_fits and _kernels and _kernel_device(x):
        return 'triton'
    return 'cpu' if cpu_fits else 'graph'
