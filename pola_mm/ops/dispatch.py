"""Where pola_mm's fast paths apply: one switch and every tuning constant.

The layers and backbones compute the published model with plain PyTorch
operations. Beside them, :mod:`pola_mm.ops` holds faster implementations of
the same computation (same outputs and gradients, tested against the plain
one): the polarity kernel and its fused CPU loops, a depth-wise conv with a
cheap bias gradient, and work on runs of tokens that keeps large
intermediates small (CPU inference and CPU training). Every decision to use
one of them is made by one function, :func:`select`, which each module
calls once per call (its input, autograd and device decide, so the choice
cannot be bound when the module is built) and whose :class:`Path` it passes
to its steps; one switch turns them all off:

- ``POLA_MM_FAST_PATHS=0`` in the environment (read at import), or
- ``with pola_mm.ops.plain_paths(): ...`` for a block of code (process-wide,
  not per thread), or :func:`set_fast_paths`.

Without fast paths every attention runs its plain PyTorch reference (e.g.
:func:`~pola_mm.ops.polarity_kernel.polarity_attention_pytorch`), softmax
windows run without ``scaled_dot_product_attention``, and every layer its
plain PyTorch forward; the same holds while a graph is captured (export,
tracing, ``torch.compile``: :func:`capturing`), so the kernels never see a
capture. ``POLA_MM_CPU_EXT=0`` is a debugging override that turns off only
the compiled CPU loops (see :mod:`pola_mm.ops.cpu_ext`).

One word for tiling, everywhere: a *run* is a contiguous range of tokens (or
of sequences) processed at a time; the constants below size them in elements
(tokens x channels of the widest tensor involved).
"""
import contextlib
import os
from typing import Iterator, NamedTuple

import torch
import torch.nn as nn
from torch import Tensor

from .precision import autocast_enabled

__all__ = [
    'FAST_PATHS_ENV', 'fast_paths_enabled', 'set_fast_paths', 'plain_paths',
    'is_compiling', 'exporting', 'capturing',
    'Path', 'PLAIN', 'select'
]

#: Environment variable: ``0`` (or ``false``/``off``/``no``) turns every fast
#: path off.
FAST_PATHS_ENV = 'POLA_MM_FAST_PATHS'

# -- tuning constants (sizes in elements; see the module docstring) --------
#: Polarity kernel on CPU: runs of about this many elements of one
#: ``(B, h, N, d)`` input, so its elementwise chains stay in cache.
KERNEL_RUN_ELEMENTS = 1 << 18
#: ... holding at least this many tokens per sequence when sequences are
#: longer (fewer, larger matrix products).
KERNEL_MIN_TOKENS = 256
#: CPU inference: polarity attention over a stage map in runs of grid rows
#: of about this many elements (keys first, then queries).
ATTN_RUN_ELEMENTS = 1 << 19
#: CPU inference: feed-forward halves of blocks in runs whose hidden layer
#: holds about this many elements ...
FFN_RUN_ELEMENTS = 1 << 20
#: ... but never fewer tokens than this per run (wide late stages).
FFN_MIN_TOKENS = 1024
#: CPU inference: in-place norm of the patch embeddings' output in runs of
#: this many elements.
NORM_RUN_ELEMENTS = 1 << 20
#: CPU training: MLP and fused projections in runs of this many elements of
#: their widest tensor ...
TRAIN_RUN_ELEMENTS = 1 << 20
#: ... from this many runs on (smaller maps keep the plain layers) ...
TRAIN_MIN_RUNS = 4
#: ... with at least this many tokens a run.
TRAIN_MIN_TOKENS = 64


def _env_enabled(name: str) -> bool:
    return os.environ.get(name, '1').strip().lower() not in ('0', 'false',
                                                             'off', 'no')


_enabled = _env_enabled(FAST_PATHS_ENV)


def fast_paths_enabled() -> bool:
    """Whether the fast paths may run (see the module docstring)."""
    return _enabled


def set_fast_paths(enabled: bool) -> None:
    """Turn every fast path on or off for the whole process."""
    global _enabled
    _enabled = bool(enabled)


@contextlib.contextmanager
def plain_paths() -> Iterator[None]:
    """Run a block with every fast path off (the plain PyTorch model);
    the previous setting is restored on exit."""
    previous = _enabled
    set_fast_paths(False)
    try:
        yield
    finally:
        set_fast_paths(previous)


def is_compiling() -> bool:
    """Whether torch.compile is tracing (False on torch without it)."""
    fn = getattr(getattr(torch, 'compiler', None), 'is_compiling', None)
    if fn is None:  # torch < 2.3
        fn = getattr(getattr(torch, '_dynamo', None), 'is_compiling', None)
    return bool(fn()) if fn is not None else False


_is_exporting = getattr(getattr(torch, 'compiler', None), 'is_exporting',
                        None)  # torch >= 2.5


def exporting() -> bool:
    """Whether a graph is being captured for export: ``torch.jit.trace``,
    ``torch.export`` or ``torch.onnx.export`` (its TorchScript exporter
    traces, its dynamo exporter runs ``torch.export``). The captured graph
    must then hold only standard operations: no fused C++ loops, no custom
    autograd functions, no runs sized for one input. (Cheap: about 1 us.)"""
    if torch.jit.is_tracing():
        return True
    return bool(_is_exporting()) if _is_exporting is not None else False


def capturing() -> bool:
    """Whether any graph is being captured (:func:`is_compiling` or
    :func:`exporting`): code then runs on whole tensors, without runs,
    scratch buffers or ``out=`` writes into views (which ``torch.jit.trace``
    mistranslates)."""
    return is_compiling() or exporting()


class Path(NamedTuple):
    """What one call of a module may use, chosen by :func:`select`.

    A ``NamedTuple``, so that TorchScript compiles the code that reads it
    (compiled code always gets the plain ``Path()``: see
    :class:`~pola_mm.models.layers.module.PolaModule`).

    Attributes:
        kernels: the kernels of :mod:`pola_mm.ops` (same outputs and
            gradients as the plain formula they stand beside) instead of the
            plain PyTorch formula.
        sdpa: ``scaled_dot_product_attention`` for softmax attention
            instead of the explicit product-softmax-product (same result up
            to float rounding): on GPUs always; on the CPU in inference only
            (there it is several times faster, while for forward + backward
            the explicit form is faster; docs/performance.md).
        autograd: autograd records the call, so the lean training functions
            apply (:func:`~pola_mm.ops.gelu_linear.gelu_linear`,
            :func:`~pola_mm.ops.gate_linear.gate_linear`, the depth-wise
            conv's weight gradient).
        cpu_inference: CPU, autograd records nothing: work in runs of
            tokens, in place and on channels-last maps.
        cpu_training: CPU training in float32 / float64 with parameters of
            the input's dtype and no autocast: large layers in runs of
            tokens (:mod:`pola_mm.ops.token_runs`, where
            :func:`~pola_mm.ops.token_runs.runs_pay` holds).
    """
    kernels: bool = False
    sdpa: bool = False
    autograd: bool = False
    cpu_inference: bool = False
    cpu_training: bool = False


#: The plain PyTorch model: fast paths off or a graph captured.
PLAIN = Path()


def select(x: Tensor, *modules: nn.Module) -> Path:
    """The one decision of a module's call: which fast paths it may use on
    input ``x``, given the switch, graph capture, the device, autograd
    (whether it records anything computed from ``x`` or the parameters of
    ``modules``) and autocast. :data:`PLAIN` with the fast paths off, while
    a graph is captured (:func:`capturing`: exporters and ``torch.compile``
    see the plain formula, written in standard operations) and while
    ``torch.fx`` traces (``x`` a ``Proxy``)."""
    if not _enabled or capturing() or isinstance(x, torch.fx.Proxy):
        return PLAIN
    params = [p for m in modules for p in m.parameters()]
    records = torch.is_grad_enabled() and (x.requires_grad or any(
        p.requires_grad for p in params))
    cpu = x.device.type == 'cpu'
    training = (cpu and records
                and x.dtype in (torch.float32, torch.float64)
                and all(p.dtype == x.dtype and p.device == x.device
                        for p in params)
                and not autocast_enabled('cpu'))
    return Path(kernels=True, sdpa=not (cpu and records), autograd=records,
                cpu_inference=cpu and not records, cpu_training=training)
