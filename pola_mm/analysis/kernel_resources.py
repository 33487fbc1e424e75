"""The attention kernels' resources on real GPU architectures, compiled on
a machine without a GPU; and the bytes each launch reads and writes.

**Resources** (``tools/analysis/kernel_resources.py``). Every Triton kernel
launch that the attention ops make (:mod:`pola_mm.ops.polarity.triton`,
:mod:`pola_mm.ops.pacs.triton`) is compiled for each architecture of
:data:`pola_mm.ops.launch.TARGETS` (sm_80, sm_86, sm_89, sm_90) and each
build's resources are read:

1. *Capture* (:func:`capture_launches`): the kernel wrappers
   (``polarity_forward`` / ``polarity_backward``, ``pacs_forward`` /
   ``pacs_backward``) run on small CPU tensors shaped as the models pass
   them (``q``, ``k``, ``v`` strided views of one packed projection;
   the parameters, the key bias and the rotary factors float32, as under
   autocast) inside :func:`~pola_mm.ops.launch.compiling_for` of each
   target, with ``triton.runtime.jit.JITFunction.run`` replaced by a
   recorder that binds the arguments exactly as the JIT does for that
   target (``create_function_from_signature``, ``JITFunction._pack_args``
   with the target's backend: pointer dtypes, ``i32`` / ``i64``, the
   divisibility-by-16 attributes, integers equal to 1 made constants) and
   returns without running. The backward wrappers get the forward's
   outputs (uninitialised, correctly shaped). This needs kernels that are
   ``JITFunction`` s: a process where ``TRITON_INTERPRET`` was not set when
   pola_mm's kernels were defined.
2. *Build* (:func:`compile_builds`): each distinct build (kernel,
   signature, constants, attributes, launch options, target) is compiled by
   ``triton.compile(ASTSource(...), target=GPUTarget('cuda', cc, 32))`` in a
   pool of worker processes; ``cuobjdump -res-usage`` (beside Triton's
   ``ptxas``) reads the cubin's registers per thread (REG), local memory per
   thread (STACK: spilled registers) and static shared memory, and the
   build's metadata its dynamic shared memory.
3. *Check* (:func:`failures`): a build fails on a compile error, on shared
   memory above the target's per-block limit
   (:attr:`~pola_mm.ops.launch.Target.shared_memory`), on any local
   memory (STACK > 0), and on registers that no multiprocessor can hold
   for one block (occupancy 0: the driver refuses the launch).
   :func:`occupancy` gives the warps resident per multiprocessor
   (registers and shared memory, :data:`SM_LIMITS`).

Integer arguments are specialised by their values (1, multiples of 16),
so the builds are those of the capture's shape (:data:`CAPTURE_SHAPE`:
two heads, 200 tokens, two chunks per image and head as the wrappers
split on a device without multiprocessors); other shapes may compile
other specialisations of the same code (``capture=``).

**Traffic** (:func:`estimate_traffic`, ``--traffic``): arithmetic, not a
measurement. From the tensors each launch of one op receives at a given
shape, the bytes a kernel reads (its input tensors) and writes (the
outputs of its custom op), each tensor counted once per launch (and only
where the build uses it: :func:`used_arguments`) with the elements it
spans (a broadcast dimension once: a token map ``N d`` per
image and head, a per-chunk partial row its full size); the torch
operations between the launches (the sums of the partial rows, their
division, casts) count their inputs read and outputs written. Caches are
ignored; a tensor that several programs read (the summed rows) counts
once. The bound: ``q``, ``k``, ``v`` read and ``x`` written once (forward),
``dx``, ``q``, ``k``, ``v`` read and ``dq``, ``dk``, ``dv`` written once
(backward).
"""
import contextlib
import dataclasses
import importlib
import itertools
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence,
                    Set, Tuple)

import torch
from mmengine.logging import print_log
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    'OPS', 'DTYPES', 'CANDIDATE_WIDTHS', 'FLAGS', 'STAGES', 'SM_LIMITS',
    'CAPTURE_SHAPE', 'Configuration', 'TensorUse', 'Launch', 'Build',
    'head_widths', 'configurations', 'capture_launches', 'unique_builds',
    'compile_builds', 'occupancy', 'parse_res_usage', 'failures',
    'format_table', 'Traffic', 'used_arguments', 'estimate_traffic',
    'format_traffic', 'cuobjdump_path'
]

#: The attention ops whose kernels are checked.
OPS = ('polarity', 'pacs')
#: The input dtypes the kernels take, by name.
DTYPES: Dict[str, torch.dtype] = {
    'float32': torch.float32,
    'float16': torch.float16,
    'bfloat16': torch.bfloat16
}
#: The head widths tried against each op's ``fits()``
#: (:func:`head_widths`).
CANDIDATE_WIDTHS = (8, 16, 24, 32, 48, 64, 96, 128, 256)
#: Each op's flags (every combination is a configuration): polarity's key
#: bias (PolaFormer's positional table), PaCS's rotary encoding and its
#: scaled keys (``scale`` and the key bias of PolarityAttention's
#: ``feature_map='pacs'``) change the forward and backward kernels,
#: ``atomic`` how the passes that sum over chunks add their partial sums
#: (:func:`~pola_mm.ops.launch.reduce_atomically`: atomically, or one slot
#: per chunk under deterministic algorithms), ``need_v`` the key backward.
FLAGS: Dict[str, Tuple[str, ...]] = {
    'polarity': ('bias', 'atomic', 'need_v'),
    'pacs': ('rotary', 'scaled', 'atomic', 'need_v'),
}
#: ``(B, h, N)`` of the capture: images, heads, tokens (``n = N`` keys).
CAPTURE_SHAPE = (1, 2, 200)
#: The kernels of one op in launch order (the custom ops' suffixes).
STAGES = ('key_pass', 'query_pass', 'query_grad', 'key_grad')

_ALPHA = 4.0  # polarity's exponent range (a float argument: not specialised)


@dataclasses.dataclass(frozen=True)
class SMLimits:
    """One architecture's per-multiprocessor limits (CUDA programming guide,
    "compute capabilities"): warps and blocks resident, registers, and the
    shared memory of the largest carve-out."""
    max_warps: int
    max_blocks: int
    registers: int
    shared_memory: int


#: Per-multiprocessor limits of the checked architectures.
SM_LIMITS: Dict[str, SMLimits] = {
    'sm_80': SMLimits(64, 32, 65536, 164 * 1024),
    'sm_86': SMLimits(48, 16, 65536, 100 * 1024),
    'sm_89': SMLimits(48, 24, 65536, 100 * 1024),
    'sm_90': SMLimits(64, 32, 65536, 228 * 1024),
}


@dataclasses.dataclass(frozen=True)
class Configuration:
    """One call of an op's kernels: the op, head width ``d``, input dtype
    name and flags (``((name, value), ...)`` in :data:`FLAGS` order)."""
    op: str
    d: int
    dtype: str
    flags: Tuple[Tuple[str, bool], ...]

    def flag(self, name: str) -> bool:
        """The value of flag ``name``."""
        return dict(self.flags)[name]


@dataclasses.dataclass(frozen=True)
class TensorUse:
    """A tensor argument of a launch: parameter name, shape, strides,
    element size, the storage it lives in (``(storage pointer, offset)``)
    and whether the launch writes it (an output of the launch's custom op;
    None where no custom op wraps the launch)."""
    param: str
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    itemsize: int
    storage: Tuple[int, int]
    written: Optional[bool] = None

    @property
    def elements(self) -> int:
        """The distinct elements the tensor spans: a broadcast dimension
        (stride 0) counts once."""
        return math.prod(s for s, st in zip(self.shape, self.stride)
                         if st != 0) if all(self.shape) else 0

    @property
    def nbytes(self) -> int:
        """``elements * itemsize``."""
        return self.elements * self.itemsize

    @property
    def identity(self) -> tuple:
        """Equal for the same tensor passed twice (a dummy argument)."""
        return (self.storage, self.shape, self.stride, self.itemsize)


@dataclasses.dataclass
class Launch:
    """One captured kernel launch, bound for one target as the JIT binds
    it.

    Attributes:
        config: the op call that launched it.
        target: the architecture's name (a key of ``TARGETS``).
        stage: the kernel's place in the scheme (:data:`STAGES`; the
            custom op's name without the op's prefix), or the kernel's
            function name where no custom op wraps the launch.
        function: ``module:qualname`` of the ``JITFunction``.
        grid: the launch grid.
        signature, constexprs, attrs: what ``ASTSource`` takes.
        options: the parsed launch options (``CUDAOptions.__dict__``).
        tensors: the tensor arguments.
    """
    config: Configuration
    target: str
    stage: str
    function: str
    grid: Tuple[int, ...]
    signature: Dict[str, str]
    constexprs: Dict[tuple, Any]
    attrs: Dict[tuple, Any]
    options: Dict[str, Any]
    tensors: List[TensorUse]

    @property
    def build_key(self) -> tuple:
        """Equal for launches that compile the same binary."""
        return (self.function, self.target,
                tuple(sorted(self.signature.items())),
                tuple(sorted((k, repr(v))
                             for k, v in self.constexprs.items())),
                tuple(sorted((k, repr(v)) for k, v in self.attrs.items())),
                tuple(sorted((k, repr(v)) for k, v in self.options.items())))


@dataclasses.dataclass
class Build:
    """One distinct build and the configurations that launch it."""
    launches: List[Launch]

    @property
    def first(self) -> Launch:
        return self.launches[0]

    @property
    def flags(self) -> Dict[str, bool]:
        """The op flags on which every launching configuration agrees
        (the flags that select this build)."""
        common = dict(self.first.config.flags)
        for launch in self.launches[1:]:
            for name, value in launch.config.flags:
                if common.get(name) != value:
                    common.pop(name, None)
        return common

    @property
    def block(self) -> Optional[int]:
        """Tokens per tile: the ``BLOCK*`` constant of the build."""
        fn = _resolve(self.first.function)
        for path, value in self.first.constexprs.items():
            if len(path) == 1 and fn.arg_names[path[0]].startswith('BLOCK'):
                return int(value)
        return None


# --- capture -------------------------------------------------------------


def head_widths(op: str) -> Tuple[int, ...]:
    """The head widths of :data:`CANDIDATE_WIDTHS` that ``op``'s kernels
    take (its ``fits()`` on small float32 inputs): what the dispatch can
    give the kernels."""
    if op == 'polarity':
        from pola_mm.ops.polarity.triton import fits
    elif op == 'pacs':
        from pola_mm.ops.pacs.triton import fits
    else:
        raise ValueError(f'unknown op {op!r}; one of {OPS}')
    return tuple(d for d in CANDIDATE_WIDTHS
                 if fits(*(torch.zeros(1, 1, 4, d) for _ in range(3))))


def configurations(ops: Sequence[str] = OPS,
                   ds: Optional[Sequence[int]] = None,
                   dtypes: Sequence[str] = tuple(DTYPES)
                   ) -> List[Configuration]:
    """Every configuration of ``ops`` x ``ds`` x ``dtypes`` x each op's
    flags (:data:`FLAGS`, both ways).

    Args:
        ops: of :data:`OPS`.
        ds: head widths (default: each op's :func:`head_widths`).
        dtypes: names of :data:`DTYPES`.

    Raises:
        ValueError: on an unknown op or dtype, and on a head width an op's
            kernels do not take.
    """
    out = []
    for op in ops:
        if op not in FLAGS:
            raise ValueError(f'unknown op {op!r}; one of {OPS}')
        widths = head_widths(op)
        wrong = [d for d in ds or () if d not in widths]
        if wrong:
            raise ValueError(f'the {op} kernels do not take d = {wrong}; '
                             f'they take {widths}')
        for d, dtype in itertools.product(ds or widths, dtypes):
            if dtype not in DTYPES:
                raise ValueError(f'unknown dtype {dtype!r}; one of '
                                 f'{tuple(DTYPES)}')
            for values in itertools.product((False, True),
                                            repeat=len(FLAGS[op])):
                out.append(Configuration(op, int(d), dtype,
                                         tuple(zip(FLAGS[op], values))))
    return out


def _check_jit() -> None:
    """RuntimeError unless pola_mm's kernels are compiled kernels
    (``JITFunction``) rather than interpreted ones."""
    from triton.runtime.jit import JITFunction

    from pola_mm.ops.polarity import triton as kernels
    if not kernels.HAVE_TRITON:
        raise RuntimeError('the kernel resource check needs Triton')
    jitted = [v for v in vars(kernels).values()
              if type(v).__name__ in ('JITFunction', 'InterpretedFunction')]
    if not jitted or not all(isinstance(v, JITFunction) for v in jitted):
        raise RuntimeError(
            'the kernels were defined under TRITON_INTERPRET=1 (Triton\'s '
            'CPU interpreter): the resource check compiles them, run it in '
            'a process without that variable')


def _tensor_uses(bound: Dict[str, Any]) -> List[TensorUse]:
    out = []
    for name, value in bound.items():
        if isinstance(value, Tensor):
            out.append(TensorUse(
                name, tuple(value.shape), tuple(value.stride()),
                value.element_size(),
                (value.untyped_storage().data_ptr(),
                 value.storage_offset())))
    return out


class _Recorder:
    """Replaces ``JITFunction.run`` while active: each launch is bound for
    the current target and recorded, nothing runs."""

    def __init__(self, override: Optional[Dict[str, Any]] = None) -> None:
        self.launches: List[Launch] = []
        self.config: Optional[Configuration] = None
        self.target: Optional[str] = None
        self.override = dict(override or {})
        self._binders: Dict[tuple, tuple] = {}

    def _backend(self, fn, target: str) -> tuple:
        key = (id(fn), target)
        if key not in self._binders:
            from triton.backends.compiler import GPUTarget
            from triton.compiler.compiler import make_backend
            from triton.runtime.jit import create_function_from_signature

            from pola_mm.ops.launch import TARGETS
            major, minor = TARGETS[target].capability
            backend = make_backend(GPUTarget('cuda', major * 10 + minor, 32))
            binder = create_function_from_signature(fn.signature, fn.params,
                                                    backend)
            self._binders[key] = (fn, backend, binder)
        return self._binders[key][1:]

    def run(self, fn, *args, grid, warmup, **kwargs) -> None:
        """``JITFunction.run``'s binding (triton/runtime/jit.py) for the
        current target, recorded."""
        from triton import knobs
        assert self.config is not None and self.target is not None
        from triton.backends.nvidia.compiler import CUDAOptions
        options_names = {f.name for f in dataclasses.fields(CUDAOptions)}
        kwargs.update({k: v for k, v in self.override.items()
                       if k in options_names or k in fn.arg_names})
        kwargs['debug'] = kwargs.get('debug', fn.debug) or \
            knobs.runtime.debug
        kwargs['instrumentation_mode'] = \
            knobs.compilation.instrumentation_mode
        backend, binder = self._backend(fn, self.target)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(
            backend, kwargs, bound, specialization, options)
        if callable(grid):
            grid = grid(bound)
        self.launches.append(Launch(
            self.config, self.target, fn.__name__,
            f'{fn.module}:{fn.fn.__qualname__}', tuple(int(g) for g in grid),
            dict(signature), dict(constexprs), dict(attrs),
            dict(options.__dict__), _tensor_uses(bound)))


class _OpOutputs(TorchDispatchMode):
    """Marks the tensors each launch writes (the outputs of the custom op
    around it: :mod:`pola_mm.ops.custom_ops`) and names its stage; counts
    the bytes of the torch operations between the launches."""

    _NO_DATA = {'empty', 'empty_like', 'new_empty', 'empty_strided',
                'new_empty_strided', 'detach', 'lift_fresh', 'alias',
                '_reshape_alias', '_unsafe_view', 'set_', 'resize_',
                'promote_types', 'sym_size', 'sym_stride', 'sym_numel'}

    def __init__(self, recorder: _Recorder, prefix: str) -> None:
        super().__init__()
        self.recorder = recorder
        self.prefix = prefix
        self.glue: List[Tuple[str, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == 'pola_mm':
            start = len(self.recorder.launches)
            out = func(*args, **kwargs)
            outs = [t for t in _flatten(out) if isinstance(t, Tensor)]
            written = {t.untyped_storage().data_ptr() for t in outs
                       if t.numel()}
            name = func.overloadpacket.__name__
            stage = name[len(self.prefix) + 1:] if name.startswith(
                self.prefix + '_') else name
            for launch in self.recorder.launches[start:]:
                launch.stage = stage
                launch.tensors = [dataclasses.replace(
                    t, written=t.storage[0] in written)
                    for t in launch.tensors]
            return out
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if not getattr(func, 'is_view', False) and name not in self._NO_DATA:
            ins = {_identity(t): t for t in _flatten((args, kwargs))
                   if isinstance(t, Tensor)}
            outs = [t for t in _flatten(out) if isinstance(t, Tensor)]
            self.glue.append((name, sum(_span(t) for t in ins.values()),
                              sum(_span(t) for t in outs)))
        return out


def _flatten(obj) -> Iterator[Any]:
    if isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _flatten(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _flatten(item)
    else:
        yield obj


def _identity(t: Tensor) -> tuple:
    return (t.untyped_storage().data_ptr(), t.storage_offset(),
            tuple(t.shape), tuple(t.stride()), t.dtype)


def _span(t: Tensor) -> int:
    """Bytes of the distinct elements of ``t`` (broadcast dims once)."""
    if t.numel() == 0:
        return 0
    return math.prod(s for s, st in zip(t.shape, t.stride())
                     if st != 0) * t.element_size()


@contextlib.contextmanager
def _recording(recorder: _Recorder) -> Iterator[None]:
    """``JITFunction.run`` replaced by ``recorder.run``."""
    from triton.runtime.jit import JITFunction
    original = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        return recorder.run(self, *args, grid=grid, warmup=warmup, **kwargs)

    JITFunction.run = run
    try:
        yield
    finally:
        JITFunction.run = original


def _inputs(config: Configuration, B: int, h: int, N: int,
            seed: int = 0, n: Optional[int] = None) -> Dict[str, Any]:
    """The op's inputs as a model passes them: ``q``, ``k``, ``v`` views of
    one packed ``(B, N, 3, h, d)`` projection permuted to heads (with ``n
    != N`` keys, as a spatial reduction gives them: ``q`` a view of ``(B,
    N, 2, h, d)`` beside the gate, ``k``, ``v`` of ``(B, n, 2, h, d)``),
    ``dx`` token-major ``(B, N, h, d)`` (the gradient of the merged heads),
    the parameters and key bias float32, PaCS's rotary map ``hw``."""
    d = config.d
    dtype = DTYPES[config.dtype]
    g = torch.Generator().manual_seed(seed)
    n = N if n is None else n
    if n == N:
        packed = torch.randn(B, N, 3, h, d, generator=g).to(dtype)
        q, k, v = (packed[:, :, i].transpose(1, 2) for i in range(3))
    else:
        if config.op == 'pacs' and config.flag('rotary'):
            raise ValueError('the rotary encoding needs as many keys as '
                             f'queries, got n = {n}, N = {N}')
        q = torch.randn(B, N, 2, h, d, generator=g).to(dtype)[:, :, 0]
        q = q.transpose(1, 2)
        kv = torch.randn(B, n, 2, h, d, generator=g).to(dtype)
        k, v = (kv[:, :, i].transpose(1, 2) for i in range(2))
    dx = torch.randn(B, N, h, d, generator=g).to(dtype).transpose(1, 2)
    out: Dict[str, Any] = dict(q=q, k=k, v=v, dx=dx)
    if config.op == 'polarity':
        out['scale'] = torch.randn(1, h, 1, d, generator=g)
        out['power'] = torch.randn(1, h, 1, d, generator=g)
        # the positional table (1, n, C) viewed as heads, as the model does
        out['k_bias'] = (torch.randn(1, n, h * d, generator=g).reshape(
            1, n, h, d).transpose(1, 2) if config.flag('bias') else None)
    else:
        out['t1'] = torch.rand(1, h, 1, 2 * d, generator=g)
        out['t2'] = torch.rand(1, h, 1, 2 * d, generator=g)
        out['hw'] = None
        if config.flag('rotary'):
            side = max(1, int(math.isqrt(N)))
            while N % side:
                side -= 1
            out['hw'] = (side, N // side)
        scaled = config.flag('scaled')
        out['tk'] = torch.rand(1, h, 1, d, generator=g) if scaled else None
        # the positional table (1, n, C) viewed as heads, as the model does
        out['k_bias'] = (torch.randn(1, n, h * d, generator=g).reshape(
            1, n, h, d).transpose(1, 2) if scaled else None)
    return out


def _call_op(config: Configuration, inputs: Dict[str, Any],
             between: Callable[[], None] = lambda: None) -> None:
    """The op's forward wrapper, ``between()``, then its backward wrapper
    on the forward's outputs."""
    i = inputs
    need_v, atomic = config.flag('need_v'), config.flag('atomic')
    if config.op == 'polarity':
        from pola_mm.ops.polarity.triton import (polarity_backward,
                                                 polarity_forward)
        x, rz, R = polarity_forward(i['q'], i['k'], i['v'], i['scale'],
                                    i['power'], _ALPHA, i['k_bias'],
                                    atomic=atomic)
        between()
        polarity_backward(i['dx'], i['q'], i['k'], i['v'], i['scale'],
                          i['power'], _ALPHA, i['k_bias'], rz, R,
                          need_v=need_v, atomic=atomic)
    else:
        from pola_mm.ops.pacs.triton import pacs_backward, pacs_forward
        keys = dict(tk=i['tk'], k_bias=i['k_bias'], atomic=atomic)
        x, M, k_mean, rz = pacs_forward(i['q'], i['k'], i['v'], i['t1'],
                                        i['t2'], i['hw'], **keys)
        between()
        pacs_backward(i['dx'], i['q'], i['k'], i['v'], i['t1'], i['t2'],
                      i['hw'], x, M, k_mean, rz, need_v=need_v, **keys)


def capture_launches(configs: Sequence[Configuration],
                     targets: Sequence[str],
                     capture: Tuple[int, int, int] = CAPTURE_SHAPE,
                     override: Optional[Dict[str, Any]] = None
                     ) -> List[Launch]:
    """The kernel launches of ``configs`` (forward and backward) for each
    of ``targets``, bound as the JIT binds them for that target.

    Args:
        configs: the op calls (:func:`configurations`).
        targets: names of :data:`~pola_mm.ops.launch.TARGETS`.
        capture: ``(B, h, N)`` of the inputs.
        override: launch options (``num_warps``, ``num_stages``, ...) or
            kernel arguments (e.g. ``BLOCK``) forced on every launch that
            has them (what-if builds; the check's own test).

    Returns:
        The launches, in capture order.

    Raises:
        RuntimeError: when the kernels are interpreted (see the module
            docstring) or no launch was captured.
    """
    _check_jit()
    from pola_mm.ops.launch import TARGETS, compiling_for
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise ValueError(f'unknown targets {unknown}; one of {list(TARGETS)}')
    B, h, N = capture
    recorder = _Recorder(override)
    with _recording(recorder):
        for name in targets:
            recorder.target = name
            with compiling_for(TARGETS[name]):
                for config in configs:
                    recorder.config = config
                    inputs = _inputs(config, B, h, N)
                    with _OpOutputs(recorder, config.op):
                        _call_op(config, inputs)
    if not recorder.launches:
        raise RuntimeError('no kernel launch was captured')
    return recorder.launches


def unique_builds(launches: Sequence[Launch]) -> List[Build]:
    """The distinct builds of ``launches`` (first-seen order), each with
    every launch that compiles it."""
    groups: Dict[tuple, Build] = {}
    for launch in launches:
        groups.setdefault(launch.build_key, Build([])).launches.append(launch)
    return list(groups.values())


# --- build ---------------------------------------------------------------


def cuobjdump_path() -> str:
    """The ``cuobjdump`` Triton ships beside its ``ptxas``."""
    import triton
    return os.path.join(os.path.dirname(triton.__file__), 'backends',
                        'nvidia', 'bin', 'cuobjdump')


_RES = re.compile(r'REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)')


def parse_res_usage(text: str) -> Dict[str, int]:
    """``registers``, ``stack``, ``shared_static`` and ``local`` of the
    first function in ``cuobjdump -res-usage`` output.

    Raises:
        ValueError: when the output names no function's resources.
    """
    m = _RES.search(text)
    if m is None:
        raise ValueError(f'no resource line in cuobjdump output: {text!r}')
    reg, stack, shared, local = (int(g) for g in m.groups())
    return dict(registers=reg, stack=stack, shared_static=shared,
                local=local)


def _resolve(function: str):
    module, qualname = function.split(':')
    obj: Any = importlib.import_module(module)
    for part in qualname.split('.'):
        obj = getattr(obj, part)
    return obj


def _init_worker(cache_dir: str) -> None:
    """A compiling worker: the run's Triton cache, compiled kernels, and
    (on Linux) ended with the tool's process should that be killed."""
    os.environ['TRITON_CACHE_DIR'] = cache_dir
    os.environ.pop('TRITON_INTERPRET', None)
    if sys.platform.startswith('linux'):
        try:
            import ctypes
            import signal
            ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PDEATHSIG
        except (OSError, AttributeError):
            pass


def _compile_one(job: Dict[str, Any]) -> Dict[str, Any]:
    """Compile one build (in a worker) and read its resources."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    start = time.perf_counter()
    try:
        fn = _resolve(job['function'])
        src = ASTSource(fn, job['signature'], job['constexprs'],
                        job['attrs'])
        compiled = triton.compile(
            src, target=GPUTarget('cuda', job['cc'], 32),
            options=job['options'])
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, 'kernel.cubin')
            with open(path, 'wb') as f:
                f.write(compiled.asm['cubin'])
            proc = subprocess.run([cuobjdump_path(), '-res-usage', path],
                                  capture_output=True, text=True,
                                  timeout=120)
        res = parse_res_usage(proc.stdout)
        res.update(shared_dynamic=int(compiled.metadata.shared),
                   warps=int(compiled.metadata.num_warps), error=None)
    except Exception as exc:  # noqa: BLE001 - a failed build is a result
        first = str(exc).strip().splitlines()
        res = dict(error=f'{type(exc).__name__}: '
                   f'{first[0] if first else ""}'[:300])
    res['seconds'] = time.perf_counter() - start
    return res


def occupancy(target: str, registers: int, shared: int,
              num_warps: int) -> Tuple[int, float]:
    """Warps of one kernel resident per multiprocessor, and their fraction
    of the most (:data:`SM_LIMITS`), as the CUDA occupancy calculator
    counts: registers allocated per warp in units of 256, shared memory in
    units of 128 bytes plus 1 KB reserved per block; limited by the
    registers, the shared memory, the warps and the blocks per
    multiprocessor.

    Args:
        target: a key of :data:`SM_LIMITS`.
        registers: registers per thread.
        shared: shared memory per block, bytes.
        num_warps: warps per block.
    """
    lim = SM_LIMITS[target]
    per_warp = math.ceil(registers * 32 / 256) * 256
    by_regs = ((lim.registers // per_warp) // num_warps
               if per_warp else lim.max_blocks)
    smem = math.ceil(shared / 128) * 128 + 1024
    by_smem = lim.shared_memory // smem
    blocks = min(by_regs, by_smem, lim.max_warps // num_warps,
                 lim.max_blocks)
    return blocks * num_warps, blocks * num_warps / lim.max_warps


def compile_builds(builds: Sequence[Build], jobs: int = 2,
                   cache_dir: Optional[str] = None,
                   progress: Optional[Callable[[str], None]] = None
                   ) -> List[Dict[str, Any]]:
    """Compile each build for its target and read its resources.

    Args:
        builds: from :func:`unique_builds`.
        jobs: worker processes (spawned; each imports pola_mm once).
        cache_dir: Triton's cache for the workers; by default a new
            temporary folder, removed afterwards (every build compiles, its
            time is the compile's own). A kept folder makes a rerun of the
            same builds read them back.
        progress: called with one line per finished build (default:
            ``print_log``).

    Returns:
        One row per build (:func:`format_table`'s keys): ``op``,
        ``kernel``, ``function``, ``d``, ``dtype``, ``flags``,
        ``configurations``, ``target``, ``num_warps``, ``num_stages``,
        ``maxnreg`` (the register cap asked for, None without),
        ``block``, ``grid``, ``registers``, ``stack``, ``shared`` (dynamic
        + static bytes), ``limit``, ``occupancy_warps``,
        ``occupancy``, ``seconds``, ``status`` (``ok``, or what failed:
        ``error``, ``shared``, ``spill``) and ``error``.
    """
    from pola_mm.ops.launch import TARGETS
    if progress is None:
        def progress(line: str) -> None:
            print_log(line, logger='current')
    own_cache = cache_dir is None
    cache = tempfile.mkdtemp(prefix='pola_mm_triton_') if own_cache \
        else cache_dir
    rows: List[Optional[Dict[str, Any]]] = [None] * len(builds)
    try:
        import multiprocessing
        ctx = multiprocessing.get_context('spawn')
        with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=ctx,
                                 initializer=_init_worker,
                                 initargs=(cache, )) as pool:
            futures = {}
            # the widest heads' backward kernels first (the slowest builds,
            # minutes at d = 128): the pool's last minutes stay busy
            order = sorted(range(len(builds)), key=lambda i: (
                -builds[i].first.config.d,
                builds[i].first.stage != 'query_grad', i))
            for index in order:
                build = builds[index]
                first = build.first
                major, minor = TARGETS[first.target].capability
                job = dict(function=first.function,
                           signature=first.signature,
                           constexprs=first.constexprs, attrs=first.attrs,
                           options=first.options, cc=major * 10 + minor)
                futures[pool.submit(_compile_one, job)] = index
            for done, future in enumerate(as_completed(futures), 1):
                index = futures[future]
                row = _row(builds[index], future.result())
                rows[index] = row
                progress(f'[{done}/{len(builds)}] {_describe(row)}: '
                         f'{row["status"]}, REG {row["registers"]} STACK '
                         f'{row["stack"]} shared {row["shared"]} '
                         f'({row["seconds"]:.1f} s)')
    finally:
        if own_cache:
            shutil.rmtree(cache, ignore_errors=True)
    return sorted((r for r in rows if r is not None), key=_order)


def _order(row: Dict[str, Any]) -> tuple:
    """Rows by op, head width, dtype, kernel (launch order), flags and
    target."""
    from pola_mm.ops.launch import TARGETS
    stage = row['kernel']
    return (OPS.index(row['op']) if row['op'] in OPS else len(OPS),
            row['d'], list(DTYPES).index(row['dtype']),
            STAGES.index(stage) if stage in STAGES else len(STAGES), stage,
            row['flags'], list(TARGETS).index(row['target']))


def _flag_text(flags: Dict[str, bool]) -> str:
    return ' '.join(f'{k}={int(v)}' for k, v in flags.items()) or '-'


def _describe(row: Dict[str, Any]) -> str:
    return (f'{row["op"]} {row["kernel"]} d={row["d"]} {row["dtype"]} '
            f'{row["flags"]} {row["target"]} w{row["num_warps"]} '
            f's{row["num_stages"]}')


def _row(build: Build, res: Dict[str, Any]) -> Dict[str, Any]:
    """The report row of ``build`` with the worker's ``res``."""
    from pola_mm.ops.launch import TARGETS
    first = build.first
    limit = TARGETS[first.target].shared_memory
    row: Dict[str, Any] = dict(
        op=first.config.op, kernel=first.stage, function=first.function,
        d=first.config.d, dtype=first.config.dtype,
        flags=_flag_text(build.flags),
        configurations=[dict(c.config.flags) for c in build.launches],
        target=first.target, num_warps=first.options['num_warps'],
        num_stages=first.options['num_stages'],
        maxnreg=first.options.get('maxnreg'), block=build.block,
        grid=list(first.grid), limit=limit, seconds=res['seconds'],
        error=res.get('error'))
    if row['error'] is not None:
        row.update(registers=None, stack=None, shared=None,
                   occupancy_warps=None, occupancy=None, status='error')
        return row
    shared = res['shared_dynamic'] + res['shared_static']
    warps, frac = occupancy(first.target, res['registers'], shared,
                            res['warps'])
    # a block whose registers exceed the multiprocessor's file (occupancy
    # 0) is refused at launch, like one over the shared-memory limit
    status = [s for s, bad in (('shared', shared > limit),
                               ('spill', res['stack'] > 0 or res['local'] > 0),
                               ('registers', warps == 0))
              if bad]
    row.update(registers=res['registers'], stack=res['stack'],
               shared=shared, occupancy_warps=warps,
               occupancy=round(frac, 3), status='+'.join(status) or 'ok')
    return row


def failures(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The rows that fail the check: compile errors, shared memory over
    the target's limit, local memory, a block's registers over the
    multiprocessor's."""
    return [r for r in rows if r['status'] != 'ok']


_COLUMNS = (('op', 'op'), ('kernel', 'kernel'), ('d', 'd'),
            ('dtype', 'dtype'), ('flags', 'flags'), ('target', 'target'),
            ('num_warps', 'warps'), ('num_stages', 'stages'),
            ('maxnreg', 'maxnreg'), ('block', 'block'), ('registers', 'REG'),
            ('stack', 'STACK'),
            ('shared', 'shared'), ('limit', 'limit'),
            ('occupancy', 'occupancy'), ('seconds', 'build s'),
            ('status', 'status'))


def _cell(key: str, row: Dict[str, Any]) -> str:
    value = row.get(key)
    if value is None:
        return '-'
    if key == 'seconds':
        return f'{value:.1f}'
    if key == 'occupancy':
        return f'{row["occupancy_warps"]} ({value:.0%})'
    if key == 'status' and row.get('error'):
        return f'error: {row["error"]}'
    return str(value)


def format_table(rows: Sequence[Dict[str, Any]],
                 markdown: bool = False) -> str:
    """The rows as an aligned text table, or a Markdown table (for
    docs/performance.md)."""
    return _text_table([h for _, h in _COLUMNS],
                       [[_cell(k, r) for k, _ in _COLUMNS] for r in rows],
                       markdown)


def _text_table(heads: List[str], body: List[List[str]],
                markdown: bool) -> str:
    """``body`` under ``heads``: a Markdown table, or plain columns padded
    to their widest cell."""
    if markdown:
        return '\n'.join(['| ' + ' | '.join(heads) + ' |',
                          '|' + '|'.join('---' for _ in heads) + '|'] +
                         ['| ' + ' | '.join(c) + ' |' for c in body])
    widths = [max(len(h), *(len(c[i]) for c in body)) if body else len(h)
              for i, h in enumerate(heads)]
    lines = ['  '.join(h.ljust(w) for h, w in zip(heads, widths))]
    lines += ['  '.join(c.ljust(w) for c, w in zip(cells, widths))
              for cells in body]
    return '\n'.join(line.rstrip() for line in lines)


# --- traffic -------------------------------------------------------------


@dataclasses.dataclass
class Traffic:
    """The bytes one op's kernels and the torch operations between them
    read and write at one shape (arithmetic: see the module docstring).

    Attributes:
        config: the op call.
        shape: ``(B, h, N, d)``.
        keys: ``n``, the keys per image and head.
        launches: per kernel launch: ``(pass, stage, read, written)``.
        glue: per pass, the bytes the torch operations read and write.
        bound: per pass, the token maps read and written once.
    """
    config: Configuration
    shape: Tuple[int, int, int, int]
    keys: int
    launches: List[Tuple[str, str, int, int]]
    glue: Dict[str, Tuple[int, int]]
    bound: Dict[str, int]

    def total(self, pass_: str) -> int:
        """Every byte of ``pass_`` (``'forward'`` or ``'backward'``)."""
        kernels = sum(r + w for p, _, r, w in self.launches if p == pass_)
        return kernels + sum(self.glue.get(pass_, (0, 0)))


@contextlib.contextmanager
def _multiprocessors(sms: int) -> Iterator[None]:
    """pola_mm's ``multiprocessors()`` answering ``sms`` for every device
    (the chunk split of a GPU with ``sms`` multiprocessors)."""
    from pola_mm.ops import token_product
    original = token_product.multiprocessors

    def fake(device: torch.device) -> int:
        return sms

    patched = [m for name, m in list(sys.modules.items())
               if name.startswith('pola_mm.ops') and m is not None
               and getattr(m, 'multiprocessors', None) is original]
    for m in patched:
        m.multiprocessors = fake
    try:
        yield
    finally:
        for m in patched:
            m.multiprocessors = original


def used_arguments(launch: Launch) -> Optional[Set[str]]:
    """The kernel arguments ``launch``'s build uses: those still referenced
    in its Triton IR (``ttir``: the front end, inlined and simplified, no
    GPU code generated; tens of milliseconds) once the constant flags have
    removed the branches they switch off (a pointer passed as a stand-in,
    ``x`` of PaCS's query backward in half precision). None where the IR's
    arguments cannot be read (then every tensor argument counts)."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    from pola_mm.ops.launch import TARGETS
    major, minor = TARGETS[launch.target].capability
    backend = make_backend(GPUTarget('cuda', major * 10 + minor, 32))
    options = backend.parse_options(launch.options)
    src = ASTSource(_resolve(launch.function), launch.signature,
                    launch.constexprs, launch.attrs)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(backend.target, options,
                         backend.get_codegen_implementation(options),
                         backend.get_module_map(), context)
    stages: Dict[str, Callable] = {}
    backend.add_stages(stages, options, src.language)
    lines = str(stages['ttir'](module, {})).splitlines()
    heads = [i for i, line in enumerate(lines) if 'tt.func public' in line]
    if len(heads) != 1:
        return None
    params = re.findall(r'%([A-Za-z_]\w*): ', lines[heads[0]])
    if not params:
        return None
    body = '\n'.join(lines[heads[0] + 1:])
    return {p for p in params if re.search(rf'%{p}\b', body)}


def estimate_traffic(config: Configuration,
                     shape: Tuple[int, ...],
                     sms: int = 132, target: str = 'sm_90') -> Traffic:
    """The bytes ``config``'s kernels read and write at ``shape`` (see the
    module docstring: arithmetic from the launches' tensor arguments, not a
    measurement).

    Args:
        config: the op call (its ``d`` is replaced by ``shape``'s).
        shape: ``(B, h, N, d)`` with ``n = N`` keys, or ``(B, h, N, d,
            n)`` (a spatial reduction's keys).
        sms: multiprocessors of the GPU (the chunk split; 132: H100 SXM).
        target: the launch configurations' architecture.
    """
    _check_jit()
    from pola_mm.ops.launch import TARGETS, compiling_for
    B, h, N, d = shape[:4]
    n = shape[4] if len(shape) > 4 else N
    config = dataclasses.replace(config, d=d)
    recorder = _Recorder()
    recorder.config, recorder.target = config, target
    inputs = _inputs(config, B, h, N, n=n)
    passes: Dict[str, Tuple[int, int]] = {}
    with _recording(recorder), compiling_for(TARGETS[target]), \
            _multiprocessors(sms):
        mode = _OpOutputs(recorder, config.op)
        with mode:
            _call_op_passes(config, inputs, mode, passes)
    launches = []
    for launch in recorder.launches:
        used = used_arguments(launch)
        distinct = {t.identity: t for t in launch.tensors
                    if used is None or t.param in used}.values()
        read = sum(t.nbytes for t in distinct if not t.written)
        wrote = sum(t.nbytes for t in distinct if t.written)
        pass_ = 'forward' if launch.stage in STAGES[:2] else 'backward'
        launches.append((pass_, launch.stage, read, wrote))
    # q, k, v read and x written once; dx, q, k, v read and dq, dk (dv)
    # written once
    queries = B * h * N * d * DTYPES[config.dtype].itemsize
    keys = queries * n // N
    need_v = config.flag('need_v')
    bound = dict(forward=2 * queries + 2 * keys,
                 backward=3 * queries + (3 + need_v) * keys)
    return Traffic(config, (B, h, N, d), n, launches, passes, bound)


def _call_op_passes(config: Configuration, inputs: Dict[str, Any],
                    mode: _OpOutputs,
                    passes: Dict[str, Tuple[int, int]]) -> None:
    """:func:`_call_op` with the glue bytes of each pass kept apart."""
    start = [len(mode.glue)]

    def glue(name: str) -> None:
        ops = mode.glue[start[0]:]
        passes[name] = (sum(r for _, r, _ in ops), sum(w for _, _, w in ops))
        start[0] = len(mode.glue)

    _call_op(config, inputs, lambda: glue('forward'))
    glue('backward')


def format_traffic(reports: Sequence[Traffic], markdown: bool = False
                   ) -> str:
    """Per op, configuration and pass: each kernel's MB read and written,
    the torch operations', the total and its ratio to the bound."""
    heads = ['op', 'dtype', 'flags', 'pass', 'kernels: MB read / written',
             'torch ops MB', 'total MB', 'bound MB', 'total / bound']
    body = []
    for rep in reports:
        for pass_ in ('forward', 'backward'):
            kernels = ', '.join(f'{s} {r / 1e6:.2f} / {w / 1e6:.2f}'
                                for p, s, r, w in rep.launches if p == pass_)
            glue = sum(rep.glue.get(pass_, (0, 0)))
            total = rep.total(pass_)
            body.append([rep.config.op, rep.config.dtype,
                         _flag_text(dict(rep.config.flags)), pass_, kernels,
                         f'{glue / 1e6:.2f}', f'{total / 1e6:.2f}',
                         f'{rep.bound[pass_] / 1e6:.2f}',
                         f'{total / rep.bound[pass_]:.2f}'])
    return _text_table(heads, body, markdown)
