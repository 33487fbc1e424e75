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
"""
import contextlib
import os
from typing import Iterator

import torch
from torch import Tensor

__all__ = [
    'FAST_PATHS_ENV', 'fast_paths_enabled', 'set_fast_paths', 'plain_paths',
    'is_compiling', 'exporting', 'capturing', 'use_fast', 'records_grad',
    'DynamicShapeExportError'
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
