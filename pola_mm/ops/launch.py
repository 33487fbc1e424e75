"""How the attention kernels launch: the one set of rules of both Triton
kernel files (:mod:`.polarity.triton`, :mod:`.pacs.triton`).

Both attentions run the same four-kernel scheme (key pass, query pass,
query backward, key backward). This module holds what they share:

- the GPUs the kernels are checked for (:data:`TARGETS`, with each
  architecture's per-block shared-memory limit) and whether a device is one
  of them (:func:`device_admits`);
- the launch configuration of each kernel (:func:`launch_config`: tokens
  per tile, warps, pipeline stages, register cap, product precision),
  chosen per op, kernel and head width so that every launch fits each
  target's shared memory and keeps its state in registers
  (``tools/analysis/kernel_resources.py`` compiles every one of them for
  sm_80, sm_86, sm_89 and sm_90 and checks it; docs/performance.md,
  "Kernel resources", lists the one that still spills);
- the split of a pass over tokens into chunks (:func:`split_tokens`);
- the device guard of every launch (:func:`on_device`);
- how the programs' partial sums meet (:func:`reduce_atomically`,
  :func:`partial_sums`, :func:`sum_slots` and the kernels' own
  ``add_partial``): float32 atomic additions into one slot per image and
  head, or, under ``torch.use_deterministic_algorithms(True)``, one slot
  per program summed by torch in a fixed order;
- the fallback (:func:`guarded`): a kernel configuration that fails to
  compile or launch on the user's GPU gives one warning and runs the torch
  implementation, with the same results, for the rest of the process.
"""
import contextlib
import dataclasses
import functools
import math
import sys
import threading
import warnings
from typing import (Callable, ContextManager, Dict, Iterator, Optional,
                    Sequence, Tuple)

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installation
    triton = tl = None

__all__ = [
    'Target', 'TARGETS', 'LaunchConfig', 'launch_config', 'device_target',
    'device_admits', 'compiling_for', 'split_tokens', 'on_device',
    'KernelFallbackWarning', 'kernel_errors', 'guarded', 'failed',
    'config_key', 'usable', 'recomputed_grads', 'interpreted', 'KERNELS',
    'WIDTHS', 'probe_inputs', 'reduce_atomically', 'partial_sums',
    'sum_slots'
]


@dataclasses.dataclass(frozen=True)
class Target:
    """A GPU architecture the kernels are compiled for.

    Attributes:
        capability: the compute capability ``(major, minor)``.
        shared_memory: the most shared memory one program (block) may use,
            bytes (the driver's per-block opt-in limit).
    """
    capability: Tuple[int, int]
    shared_memory: int

    @property
    def name(self) -> str:
        return f'sm_{self.capability[0]}{self.capability[1]}'

    @property
    def small_shared(self) -> bool:
        """The 99 KB class (sm_86, sm_89: A10, L4, RTX 30/40)."""
        return self.shared_memory < 160 * 1024


#: The architectures every launch configuration is compiled and checked
#: for, with their per-block shared-memory limits (CUDA programming guide,
#: "compute capabilities"): A100 (sm_80), A10 / RTX 30 (sm_86), L4 / RTX 40
#: (sm_89), H100 / H200 (sm_90).
TARGETS: Dict[str, Target] = {
    t.name: t
    for t in (Target((8, 0), 163 * 1024), Target((8, 6), 99 * 1024),
              Target((8, 9), 99 * 1024), Target((9, 0), 227 * 1024))
}

#: The target assumed for ``meta`` and fake CUDA tensors (memory estimates
#: and structure tests stand for an H100).
META_TARGET = TARGETS['sm_90']

_forced: Optional[Target] = None


@contextlib.contextmanager
def compiling_for(target: Target) -> Iterator[None]:
    """Choose the launch configurations for ``target`` instead of the
    device's own (the resource check captures the launches of each
    architecture on the CPU this way)."""
    global _forced
    previous, _forced = _forced, target
    try:
        yield
    finally:
        _forced = previous


def device_target(device: torch.device) -> Target:
    """The :class:`Target` of ``device``: the CUDA device's capability and
    shared-memory limit (``torch.cuda.get_device_properties``),
    :data:`META_TARGET` for ``meta`` and fake CUDA tensors, and the forced
    one inside :func:`compiling_for`."""
    if _forced is not None:
        return _forced
    if device.type != 'cuda' or not torch.cuda.is_available():
        return META_TARGET
    return _cuda_target(device.index if device.index is not None else
                        torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_target(index: int) -> Target:
    props = torch.cuda.get_device_properties(index)
    shared = getattr(props, 'shared_memory_per_block_optin', 0)
    return Target((props.major, props.minor), int(shared))


def interpreted() -> bool:
    """Whether Triton's interpreter is on (``TRITON_INTERPRET=1``): the
    kernels then run on CPU tensors."""
    import os
    return os.environ.get('TRITON_INTERPRET', '0').strip().lower() in (
        '1', 'true', 'on', 'yes')


def device_admits(device: torch.device) -> bool:
    """Whether the kernels may run on ``device``: ``meta`` and fake CUDA
    tensors (they stand for :data:`META_TARGET`), and CUDA GPUs of compute
    capability 8.0 or newer with at least the 99 KB of shared memory per
    block of the smallest checked class (:data:`TARGETS`). Older GPUs
    (Turing, Volta: 64 KB / 96 KB) run the torch implementation."""
    if device.type == 'meta':
        return True
    if device.type != 'cuda':
        return False
    target = device_target(device)
    return (target.capability >= (8, 0)
            and target.shared_memory >= TARGETS['sm_86'].shared_memory)


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """One kernel's launch settings: ``block`` tokens per tile, Triton's
    ``num_warps`` and ``num_stages``, ``maxnreg`` (registers a thread may
    use; None: ptxas's own choice) and ``dot``, the input precision of
    every ``tl.dot`` of the kernel (:data:`DOT`)."""
    block: int
    num_warps: int
    num_stages: int
    maxnreg: Optional[int] = None
    dot: str = 'ieee'

    def options(self) -> Dict[str, object]:
        """The keyword arguments of the launch (``DOT`` is the kernels'
        constexpr of the product precision)."""
        options = dict(num_warps=self.num_warps,
                       num_stages=self.num_stages, DOT=self.dot)
        if self.maxnreg is not None:
            options['maxnreg'] = self.maxnreg
        return options


#: The products' input precision on a GPU: ``tf32x3``, three TF32
#: tensor-core products per float32 product (``a_hi b_hi + a_hi b_lo +
#: a_lo b_hi``), about float32's accuracy (docs/performance.md, "Kernel
#: resources"); ``ieee`` float32 products on the FMA units held the
#: operands of a 64-wide product in registers and spilled.
DOT = 'ieee'


#: The kernels of the scheme, as :func:`launch_config` names them.
KERNELS = ('key_pass', 'query_pass', 'query_grad', 'key_grad')


#: Tokens per tile and warps of each op's kernels, by head width: ``(op,
#: kernel) -> {d: (block, num_warps)}``. Chosen from the compiled resources
#: (``tools/analysis/kernel_resources.py``; docs/performance.md, "Kernel
#: resources"): the products are IEEE float32 ``tl.dot`` on the FMA units,
#: whose operands live in registers, so the tile shrinks as ``d`` grows
#: until no build spills (8 warps: up to 255 registers a thread).
_TILES: Dict[Tuple[str, str], Dict[int, Tuple[int, int]]] = {
    ('polarity', 'key_pass'): {16: (64, 4), 32: (64, 8), 64: (32, 8)},
    ('polarity', 'query_pass'): {16: (64, 4), 32: (64, 8), 64: (32, 8)},
    ('polarity', 'query_grad'): {16: (64, 8), 32: (64, 8), 64: (16, 8)},
    ('polarity', 'key_grad'): {16: (64, 4), 32: (32, 8), 64: (16, 8)},
    ('pacs', 'key_pass'): {16: (64, 4), 32: (64, 8), 64: (32, 8)},
    ('pacs', 'query_pass'): {16: (64, 4), 32: (64, 8), 64: (32, 8)},
    ('pacs', 'query_grad'): {16: (16, 8), 32: (16, 8), 64: (16, 8)},
    ('pacs', 'key_grad'): {16: (32, 8), 32: (16, 8), 64: (16, 8)},
}
#: Head widths the kernels take: those of :data:`_TILES`, all checked.
WIDTHS = (16, 32, 64)


def launch_config(op: str, kernel: str, d: int) -> LaunchConfig:
    """The launch configuration of ``op``'s ``kernel`` (one of
    :data:`KERNELS`) at head width ``d`` (one of :data:`WIDTHS`), for
    inputs of every dtype: tokens per tile and warps from
    :data:`_TILES`; two pipeline stages for the forward passes up to ``d =
    32`` (their tiles fit twice in every target's shared memory), one
    otherwise; the register cap per kernel (below). The rule is
    the same for every target (:data:`TARGETS`): each of its builds fits
    the smallest shared memory of them.
    """
    if kernel not in KERNELS or (op, kernel) not in _TILES:
        raise ValueError(f'unknown kernel {op!r} {kernel!r}; the kernels '
                         f'are {KERNELS} of polarity and pacs')
    if d not in WIDTHS:
        raise ValueError(f'no launch configuration for d={d}; the kernels '
                         f'take d in {WIDTHS}')
    block, warps = _TILES[op, kernel][d]
    forward = kernel in ('key_pass', 'query_pass')
    stages = 2 if forward and d <= 32 else 1
    # ptxas stops at 128 registers a thread for 8 warps and spills a few
    # bytes; 255 keeps these kernels in registers. Polarity's query
    # backward spills less with ptxas's own choice.
    maxnreg = None if (op, kernel) == ('polarity', 'query_grad') else 255
    return LaunchConfig(block, warps, stages, maxnreg, DOT)


def split_tokens(n: int, block: int, bh: int, device: torch.device,
                 chunks: Optional[int] = None) -> Tuple[int, int]:
    """How a pass that sums over ``n`` tokens splits them: ``(chunks,
    blocks per chunk)``.

    ``chunks`` programs per image and head, by default enough for about two
    waves over the GPU's multiprocessors for all ``bh`` images and heads
    (two on other devices: the interpreter exercises the split), never more
    than the ``ceil(n / block)`` tiles, and none empty.
    """
    from .token_product import multiprocessors
    blocks = max(1, math.ceil(n / block))
    if chunks is None:
        sms = multiprocessors(device)
        chunks = math.ceil(2 * sms / max(bh, 1)) if sms else 2
    chunks = max(1, min(int(chunks), blocks))
    per = math.ceil(blocks / chunks)
    return math.ceil(blocks / per), per


def on_device(t: Tensor) -> ContextManager:
    """The device guard of a launch: ``t``'s CUDA device made current
    (Triton launches on the current device)."""
    if t.device.type == 'cuda' and torch.cuda.is_available():
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


class KernelFallbackWarning(RuntimeWarning):
    """A kernel configuration failed on this GPU; its attention runs the
    torch implementation from now on (same results, slower)."""


def kernel_errors(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of a kernel configuration on this GPU
    rather than of the inputs: Triton's own errors (``OutOfResources``,
    ``CompilationError``, ``PTXASError``, ...) and the runtime errors of
    compiling and launching. Out of memory is not: the torch
    implementation would need more memory still."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return False
    try:
        from triton.errors import TritonError
    except ImportError:  # pragma: no cover - older triton
        TritonError = ()
    if TritonError and isinstance(exc, TritonError):
        return True
    return isinstance(exc, RuntimeError)


_failed: Dict[tuple, str] = {}
_lock = threading.Lock()


def config_key(op: str, q: Tensor, **flags) -> tuple:
    """The configuration a kernel failure is remembered for: the op, the
    head width, the dtype, the flags and the device."""
    return (op, int(q.shape[-1]), str(q.dtype), str(q.device)) + tuple(
        sorted(flags.items()))


def failed(key: tuple) -> bool:
    """Whether the configuration ``key`` failed earlier in this process."""
    return key in _failed


def guarded(key: tuple, kernels: Callable[[], object],
            fallback: Callable[[], object]) -> object:
    """``kernels()``; where it fails for a reason of the GPU
    (:func:`kernel_errors`), one :class:`KernelFallbackWarning` naming the
    configuration and ``POLA_MM_OPS``, ``key`` remembered as failed
    (:func:`failed`: the op takes the torch implementation from then on),
    and ``fallback()``."""
    if key in _failed:
        return fallback()
    try:
        return kernels()
    except Exception as exc:  # noqa: BLE001 - kernel_errors decides
        if not kernel_errors(exc):
            raise
        with _lock:
            first = key not in _failed
            _failed[key] = f'{type(exc).__name__}: {exc}'
        if first:
            op, d, dtype, device = key[:4]
            first_line = (str(exc).splitlines() or [''])[0]
            flags = ', '.join(f'{k}={v}' for k, v in key[4:])
            warnings.warn(
                f'pola_mm: the {op} Triton kernels failed on {device} for '
                f'd={d}, {dtype}{", " + flags if flags else ""} '
                f'({type(exc).__name__}: {first_line}); '
                'this configuration runs the torch implementation from now '
                'on, with the same results. POLA_MM_OPS=cpu turns the '
                'kernels off.', KernelFallbackWarning, stacklevel=3)
        return fallback()


def usable(key: tuple, probe: Callable[[tuple], None]) -> bool:
    """Whether the kernels of configuration ``key`` may run: not if it
    failed earlier in this process. Under ``torch.compile`` a failure
    inside the compiled graph could not fall back, so the configuration is
    first run once on small inputs on the GPU while the graph is traced
    (``probe(key)``, under :func:`guarded`): the graph holds the kernels
    only if they launch here."""
    if _is_compiling():  # (a constant of the graph: no guard on _failed)
        return _probed(key, probe)
    return key not in _failed


def probe_inputs(key: tuple, tokens: int = 80
                 ) -> Tuple[Tensor, Tensor, Tensor, Dict[str, object]]:
    """Small ``(1, 2, tokens, d)`` ``q``, ``k``, ``v`` that require grad, in
    the dtype and on the device of the configuration ``key``
    (:func:`config_key`'s), and its flags: what an op's probe runs."""
    _, d, dtype, device = key[:4]
    like = dict(device=device, dtype=getattr(torch, dtype.split('.')[-1]))
    q, k, v = (torch.randn(1, 2, tokens, d, **like).requires_grad_()
               for _ in range(3))
    return q, k, v, dict(key[4:])


def _is_compiling() -> bool:
    fn = getattr(getattr(torch, 'compiler', None), 'is_compiling', None)
    return bool(fn()) if fn is not None else False


def _probe_once(key: tuple, probe: Callable[[tuple], None]) -> bool:
    """Runs ``probe(key)`` on a real GPU (not for ``meta`` or fake CUDA
    tensors; on the CPU where Triton's interpreter runs the kernels) under
    :func:`guarded`, once per configuration."""
    device = key[3]
    real = (device == 'cpu' or device.startswith('cuda')
            and torch.cuda.is_available())
    if key in _probed_keys or not real:
        return key not in _failed
    _probed_keys.add(key)
    guarded(key, lambda: probe(key), lambda: None)
    return key not in _failed


_probed_keys: set = set()


def _assume_constant_result(fn: Callable) -> Callable:
    """``torch.compiler.assume_constant_result(fn)``: while dynamo traces,
    ``fn`` is called eagerly and its result taken as a constant. That
    function imports ``torch._dynamo`` (a second of start-up, and entries
    in torch's weights-only allow-list); until dynamo is loaded, ``fn`` gets
    the one mark it sets instead (``tests/ops/test_kernel_compile.py``
    checks that dynamo honours it)."""
    public = getattr(getattr(torch, 'compiler', None),
                     'assume_constant_result', None)
    if public is not None and 'torch._dynamo' in sys.modules:
        return public(fn)
    fn._dynamo_marked_constant = True
    return fn


_probed = _assume_constant_result(_probe_once)


def forget_failures() -> None:
    """Forget every remembered failure and probe (tests)."""
    _failed.clear()
    _probed_keys.clear()


def recomputed_grads(fn: Callable[..., Tensor], inputs: Sequence[object],
                     needs: Sequence[bool], grad_out: Tensor) -> tuple:
    """The gradients of ``fn(*inputs)`` for the tensor inputs whose entry
    of ``needs`` is set (None for the others), by running ``fn`` again
    under autograd: the backward of a kernel configuration that failed
    (:func:`guarded`), by the torch implementation."""
    with torch.enable_grad():
        leaves = [
            t.detach().requires_grad_(bool(need)) if isinstance(t, Tensor)
            else t for t, need in zip(inputs, needs)
        ]
        wanted = [i for i, (t, need) in enumerate(zip(leaves, needs))
                  if need and isinstance(t, Tensor)]
        out = fn(*leaves)
        grads = torch.autograd.grad(out, [leaves[i] for i in wanted],
                                    grad_out, allow_unused=True)
    result = [None] * len(leaves)
    for i, g in zip(wanted, grads):
        result[i] = g
    return tuple(result)


def reduce_atomically() -> bool:
    """Whether the kernels add their programs' partial sums atomically
    (float32 ``tl.atomic_add`` into one slot per image and head: the
    default, no write and read-back of per-program partial sums; the order
    of the additions, and so the last bits of the sums, may change from run
    to run) rather than each writing its own slot for torch to sum in a
    fixed order (bitwise reproducible): the latter under
    ``torch.use_deterministic_algorithms(True)``, which mmengine's
    ``randomness=dict(deterministic=True)`` sets."""
    return not torch.are_deterministic_algorithms_enabled()


def partial_sums(bh: int, chunks: int, tail: Sequence[int],
                 device: torch.device, atomic: bool) -> Tensor:
    """The float32 buffer of a pass's partial sums, ``(bh, slots, *tail)``:
    one slot of zeros that the programs add to when ``atomic``, else one
    slot per chunk (each program writes its own)."""
    shape = (bh, 1 if atomic else chunks, *tail)
    make = torch.zeros if atomic else torch.empty
    return make(shape, dtype=torch.float32, device=device)


def sum_slots(part: Tensor) -> Tensor:
    """Partial sums ``(bh, slots, ...)`` summed over the slots (the one
    slot itself, a view, when they were added atomically)."""
    return part[:, 0] if part.shape[1] == 1 else part.sum(1)


if triton is not None:

    @triton.jit
    def add_partial(ptr, values, mask, ATOMIC: tl.constexpr):
        """A program's partial sum ``values`` into its slot at ``ptr``
        (where ``mask``, None: everywhere): added atomically (the slot
        shared by all chunks, see :func:`reduce_atomically`) or written
        (its own slot)."""
        if ATOMIC:
            tl.atomic_add(ptr, values, mask=mask, sem='relaxed')
        else:
            tl.store(ptr, values, mask=mask)

    @triton.jit
    def slot_row(PART, bh, c, chunks, ROW, ATOMIC: tl.constexpr):
        """The row of chunk ``c`` of image and head ``bh`` in a partial-sum
        buffer of rows of ``ROW`` values (:func:`partial_sums`):
        ``PART[bh, 0]``, shared by the chunks, when they add ``ATOMIC``-ally,
        else ``PART[bh, c]``."""
        if ATOMIC:
            slot = bh
        else:
            slot = bh * chunks + c
        return PART + slot * ROW
