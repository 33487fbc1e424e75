"""Activation memory of a training step, measured without a GPU.

What a training step keeps for backward is decided by the forward alone:
every tensor autograd saves (``torch.autograd.graph.saved_tensors_hooks``
sees each one) stays allocated until backward uses it. Summing the bytes of
the *distinct storages* saved during a forward in training mode gives the
activation memory of the step, without running any arithmetic:

- ``device='cuda'`` (the default): the model and its inputs are fake CUDA
  tensors (``torch._subclasses.FakeTensorMode``: shapes, dtypes, strides
  and storage sharing as on a GPU, data on the ``meta`` device, nothing
  computed). The model takes its CUDA code path (``x.device.type ==
  'cuda'`` everywhere, none of pola_mm's CPU fast paths), and mixed
  precision is CUDA's own autocast: its dispatch key runs on fake CUDA
  tensors, so the casts, the fp16 weight copies and the float32 ops
  (``layer_norm``, ``softmax``, ...) are exactly those of a GPU step. Only
  ``torch.autocast('cuda')``'s Python check for a real GPU is bypassed
  (:func:`_cuda_autocast`). ``scaled_dot_product_attention`` is counted as
  the memory-efficient kernel CUDA picks (saves q, k, v, the output and
  its log-sum-exp), not the math fallback that fake tensors would trace.
- ``device='meta'``: plain meta tensors. Autocast has no meta backend, so
  mixed precision is *emulated*: parameters and inputs are cast to
  fp16/bf16 and the model runs in that dtype; pola_mm's attention upcasts
  to float32 exactly as it does under autocast (``mix`` computes in
  ``promote_types(dtype, float32)``). Unlike autocast, norms, softmax and
  GELU then run (and save) in fp16 and no fp16 weight copies exist; see
  docs/performance.md for how far apart the two are.
- ``device='cpu'``: a real CPU forward with the same hooks (validation:
  on a model whose CPU path saves the same tensors it must agree exactly
  with ``'meta'``; expensive at large sizes).

Storages are identified by their ``StorageImpl`` (``untyped_storage()
._cdata``, which also holds on meta and fake tensors where ``data_ptr`` is
0): views of one storage count once, parameters, buffers and the inputs are
left out (reported separately), and a storage whose saving graph node was
freed before the end of the forward is not counted. Each saved storage is
attributed to the innermost module running when it was first saved, to the
torch function that saved it and to the line of model code that called it.

Whole OpenMMLab configs (mmdet, mmseg, mmpretrain): the backbone and neck
(``extract_feat``) are measured with a scalar loss of their outputs; the
heads' losses need data-dependent shapes (assigners, sampling, NMS, mmcv
ops) that meta and fake tensors cannot run.
"""
import contextlib
import os
import os.path as osp
import sys
import weakref
from dataclasses import asdict, dataclass, field
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence,
                    Tuple)

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.logging import print_log
from torch import Tensor
from torch.overrides import TorchFunctionMode

from ..type_aliases import Size2
from .zoo import Spec, build, stage_of

__all__ = [
    'stage_of', 'DEVICES', 'PRECISIONS', 'SavedTensor', 'MemoryReport',
    'SavedTensorCounter', 'measure_saved', 'measure', 'stage_of',
    'format_comparison', 'format_breakdown', 'cuda_memory_check'
]

MiB = float(1 << 20)

#: ``device`` values of :func:`measure`.
DEVICES = ('cuda', 'meta', 'cpu')
#: ``precision`` values: float32, and fp16/bf16 mixed precision.
PRECISIONS = ('fp32', 'fp16', 'bf16')
_AMP_DTYPES = {'fp16': torch.float16, 'bf16': torch.bfloat16}

_SAVED_BY_ITSELF = '(autograd.Function)'


@dataclass
class SavedTensor:
    """One distinct storage saved for backward.

    Attributes:
        module: innermost module running when it was first saved (dotted
            path in the measured model, ``''`` for the top level).
        stage: :func:`stage_of` ``module``.
        op: the torch function that saved it (outermost one called by
            model code) or ``'(autograd.Function)'`` for a custom function's
            ``save_for_backward``.
        where: ``file:line`` of the model code that made the call.
        shape: shape of the first saved view.
        dtype: its dtype (``'float32'``, ...).
        nbytes: bytes of the whole storage.
    """
    module: str
    stage: str
    op: str
    where: str
    shape: Tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass
class MemoryReport:
    """What :func:`measure` found for one model.

    Attributes:
        name: the model (name, config file or class).
        device, precision, batch, hw: how it was measured.
        saved: every distinct saved storage (see :class:`SavedTensor`).
        input_bytes: the inputs' storages (not in :attr:`total`).
        output_bytes: storages of the forward's outputs not saved for
            backward (alive at the start of backward, not in :attr:`total`).
        param_bytes: parameters and buffers.
        freed_bytes: saved storages whose graph nodes were freed before the
            end of the forward (not in :attr:`total`).
        scope: what was measured (``'backbone'``, ``'extract_feat'``).
    """
    name: str
    device: str
    precision: str
    batch: int
    hw: Size2
    saved: List[SavedTensor] = field(default_factory=list)
    input_bytes: int = 0
    output_bytes: int = 0
    param_bytes: int = 0
    freed_bytes: int = 0
    scope: str = 'backbone'

    @property
    def total(self) -> int:
        """Bytes saved for backward (distinct storages)."""
        return sum(s.nbytes for s in self.saved)

    def by_stage(self) -> Dict[str, int]:
        """Bytes per stage (see :func:`stage_of`), in order of first use."""
        out: Dict[str, int] = {}
        for s in self.saved:
            out[s.stage] = out.get(s.stage, 0) + s.nbytes
        return out

    def by_module(self, prefix: str = '') -> Dict[str, int]:
        """Bytes per module whose path starts with ``prefix``."""
        out: Dict[str, int] = {}
        for s in self.saved:
            if s.module.startswith(prefix):
                out[s.module] = out.get(s.module, 0) + s.nbytes
        return out

    def to_dict(self) -> Dict[str, Any]:
        """JSON-friendly form (with ``total``)."""
        d = asdict(self)
        d['total'] = self.total
        return d


# -- counting ----------------------------------------------------------------
def _storage_key(t: Tensor) -> int:
    """Identity of the storage behind ``t`` (shared by all its views; works
    on meta and fake tensors, whose ``data_ptr`` is 0)."""
    return t.untyped_storage()._cdata


_SKIP_DIRS = (osp.dirname(torch.__file__) + os.sep, osp.abspath(__file__))


def _caller() -> str:
    """``path:line`` of the innermost frame outside torch and this file,
    shortened to the path inside its package root."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_SKIP_DIRS[0]) and name != _SKIP_DIRS[1] \
                and not name.startswith('<'):
            return f'{_short_path(name)}:{f.f_lineno}'
        f = f.f_back
    return '?'


def _short_path(path: str) -> str:
    for marker in ('site-packages' + os.sep, 'dist-packages' + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    root = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    if path.startswith(root + os.sep):
        return osp.relpath(path, root)
    return osp.basename(path)


class _OpTracker(TorchFunctionMode):
    """Remembers the torch function being run (the outermost one called by
    Python code: ``linear``, ``layer_norm``, ...); on fake CUDA tensors also
    routes ``scaled_dot_product_attention`` to the memory-efficient kernel
    (what CUDA runs) instead of the math fallback fake tensors trace; on
    meta and fake tensors answers ``torch.equal`` (which needs values) by
    shape and dtype."""

    def __init__(self, efficient_sdpa: bool) -> None:
        super().__init__()
        self.current: List[str] = []
        self.efficient_sdpa = efficient_sdpa

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.current.append(getattr(func, '__name__', str(func)))
        try:
            if (self.efficient_sdpa
                    and func is F.scaled_dot_product_attention):
                return _efficient_sdpa(*args, **kwargs)
            if func in (torch.equal, Tensor.equal) and _no_data(args):
                # data-dependent: assumed equal when shapes and dtypes
                # match (the one caller, PaCS's check that the rotary
                # tables pair up, which rotary_tables builds so)
                a, b = args[0], args[1]
                return a.shape == b.shape and a.dtype == b.dtype
            return func(*args, **kwargs)
        finally:
            self.current.pop()


def _no_data(args: Sequence[Any]) -> bool:
    """Whether any tensor argument is meta or fake (has no values)."""
    from torch._subclasses.fake_tensor import is_fake
    return any(isinstance(a, Tensor) and (a.is_meta or is_fake(a))
               for a in args)


def _efficient_sdpa(q: Tensor, k: Tensor, v: Tensor,
                    attn_mask: Optional[Tensor] = None,
                    dropout_p: float = 0.0, is_causal: bool = False,
                    scale: Optional[float] = None, **_: Any) -> Tensor:
    """``F.scaled_dot_product_attention`` as CUDA's memory-efficient kernel
    (q, k, v ``(B, h, N, d)``); inputs cast as autocast would (SDPA is on
    CUDA autocast's lower-precision list)."""
    if torch.is_autocast_enabled('cuda'):
        dt = torch.get_autocast_dtype('cuda')
        q, k, v = (t.to(dt) if t.is_floating_point() else t
                   for t in (q, k, v))
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.to(dt)
    need = any(t.requires_grad for t in (q, k, v))
    with torch.autocast('cuda', enabled=False):
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, attn_mask, need, dropout_p, is_causal,
            scale=scale)[0]


class SavedTensorCounter:
    """Context manager that records every distinct storage autograd saves.

    Args:
        model: the module whose submodules the saved tensors are
            attributed to (forward hooks on every submodule).
        exclude: tensors not to count (parameters, buffers, inputs).
        efficient_sdpa: route SDPA to the memory-efficient kernel (fake
            CUDA tensors, see :class:`_OpTracker`).

    After the block, :attr:`saved` holds one :class:`SavedTensor` per
    storage still saved by a live graph node and :attr:`freed_bytes` the
    storages whose nodes were freed before the end.
    """

    def __init__(self, model: nn.Module, exclude: Sequence[Tensor] = (),
                 efficient_sdpa: bool = False) -> None:
        self.model = model
        self.excluded = {_storage_key(t) for t in exclude}
        self.tracker = _OpTracker(efficient_sdpa)
        self.stack: List[str] = []
        self.records: Dict[int, SavedTensor] = {}
        self.refs: Dict[int, List[weakref.ref]] = {}
        self.storages: List[Any] = []  # keeps keys unique while counting
        self.saved: List[SavedTensor] = []
        self.freed_bytes = 0
        self._handles: List[Any] = []
        self._hooks: Optional[Any] = None

    def _pack(self, t: Tensor) -> Tensor:
        key = _storage_key(t)
        if key in self.excluded or isinstance(t, nn.Parameter):
            return t
        if key not in self.records:
            st = t.untyped_storage()
            self.storages.append(st)
            module = self.stack[-1] if self.stack else ''
            op = (self.tracker.current[-1] if self.tracker.current
                  else _SAVED_BY_ITSELF)
            self.records[key] = SavedTensor(
                module=module, stage=stage_of(module), op=op,
                where=_caller(), shape=tuple(t.shape),
                dtype=str(t.dtype).replace('torch.', ''),
                nbytes=int(st.nbytes()))
            self.refs[key] = []
        # a detached alias (same storage, no grad_fn): returning an output
        # itself would make a cycle with its own node and keep it alive
        packed = t.detach()
        self.refs[key].append(weakref.ref(packed))
        return packed

    def __enter__(self) -> 'SavedTensorCounter':
        for name, mod in self.model.named_modules():
            def pre(_m, _a, name=name):
                self.stack.append(name)

            def post(_m, _a, _o):
                self.stack.pop()

            self._handles.append(mod.register_forward_pre_hook(pre))
            self._handles.append(mod.register_forward_hook(post))
        self._hooks = torch.autograd.graph.saved_tensors_hooks(
            self._pack, lambda t: t)
        self._hooks.__enter__()
        self.tracker.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.tracker.__exit__(*exc)
        self._hooks.__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._handles = []

    def finish(self) -> None:
        """Split the records into live :attr:`saved` storages and
        :attr:`freed_bytes`; call while the graph is still alive."""
        self.saved = []
        self.freed_bytes = 0
        for key, rec in self.records.items():
            if any(r() is not None for r in self.refs[key]):
                self.saved.append(rec)
            else:
                self.freed_bytes += rec.nbytes
        self.storages = []


def _distinct_bytes(tensors: Sequence[Tensor],
                    skip: Sequence[int] = ()) -> int:
    seen = set(skip)
    total = 0
    for t in tensors:
        key = _storage_key(t)
        if key not in seen:
            seen.add(key)
            total += int(t.untyped_storage().nbytes())
    return total


def _flat_tensors(x: Any) -> List[Tensor]:
    if isinstance(x, Tensor):
        return [x]
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _flat_tensors(item)]
    return []


def measure_saved(model: nn.Module, inputs: Sequence[Tensor],
                  forward: Optional[Callable[..., Any]] = None,
                  efficient_sdpa: bool = False
                  ) -> Tuple[List[SavedTensor], Dict[str, int]]:
    """Run ``forward(*inputs)`` (default ``model(*inputs)``) with
    :class:`SavedTensorCounter` (a loss reducing the outputs, e.g. a sum,
    would save nothing more).

    Works on any device (real, meta or fake tensors); autocast, if wanted,
    must be on around the call.

    Returns:
        the saved storages and ``{'input', 'output', 'param', 'freed'}``
        bytes (see :class:`MemoryReport`).
    """
    forward = forward or model
    state = [t for t in model.parameters()] + [b for b in model.buffers()]
    exclude = state + list(inputs)
    with SavedTensorCounter(model, exclude, efficient_sdpa) as counter:
        out = forward(*inputs)
    outs = _flat_tensors(out)
    counter.finish()
    skip = {_storage_key(t) for t in exclude}
    skip |= {k for k in counter.records if any(
        r() is not None for r in counter.refs[k])}
    extra = dict(input=_distinct_bytes(list(inputs)),
                 output=_distinct_bytes(outs, tuple(skip)),
                 param=_distinct_bytes(state),
                 freed=counter.freed_bytes)
    del out, outs
    return counter.saved, extra


def _spec_name(spec: Spec) -> str:
    if isinstance(spec, str):
        return spec
    if '_config_' in spec:
        return (f"{osp.basename(spec['_config_'])} with "
                f"{spec['backbone']['type']}")
    return str(spec.get('type'))


# -- measuring ---------------------------------------------------------------
@contextlib.contextmanager
def _cuda_autocast(dtype: Optional[torch.dtype]) -> Iterator[None]:
    """CUDA autocast on fake CUDA tensors: what ``torch.autocast('cuda')``
    does (enable, dtype, nesting, clear the cast cache on the way out),
    without its check for a real GPU, which would disable it here."""
    if dtype is None:
        yield
        return
    prev_on = torch.is_autocast_enabled('cuda')
    prev_dt = torch.get_autocast_dtype('cuda')
    torch.set_autocast_enabled('cuda', True)
    torch.set_autocast_dtype('cuda', dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled('cuda', prev_on)
        torch.set_autocast_dtype('cuda', prev_dt)


def _to_fake_cuda(model: nn.Module, mode: Any) -> None:
    """Replace the parameters and buffers of ``model`` by fake CUDA
    tensors of ``mode`` (same shapes, strides, dtypes, ``requires_grad``;
    call inside ``mode``)."""
    def fake(t: Tensor) -> Tensor:
        return torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype,
                                   device='cuda')

    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None:
                mod._parameters[name] = nn.Parameter(
                    fake(p), requires_grad=p.requires_grad)
        for name, b in list(mod._buffers.items()):
            if b is not None:
                mod._buffers[name] = fake(b)


@contextlib.contextmanager
def _meta_default_dtype(dtype: Optional[torch.dtype] = None
                        ) -> Iterator[None]:
    """While measuring on ``meta`` with ``dtype`` (the fp16/bf16
    emulation): the default dtype, so that masks and tables models create
    on the fly match the half-precision parameters. (The layers' float32
    islands, :func:`pola_mm.ops.precision.no_autocast`, are no-ops on
    ``meta``.)"""
    prev_default = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(prev_default)


def _check_args(batch: int, hw: Size2, precision: str, device: str) -> None:
    if batch < 1:
        raise ValueError(f'batch must be >= 1, got {batch}')
    if len(hw) != 2 or min(hw) < 1:
        raise ValueError(f'shape must be H W >= 1, got {tuple(hw)}')
    if precision not in PRECISIONS:
        raise ValueError(f'precision must be one of {PRECISIONS}, '
                         f'got {precision!r}')
    if device not in DEVICES:
        raise ValueError(f'device must be one of {DEVICES}, got {device!r}')


def measure(spec: Spec, batch: int = 2, hw: Size2 = (224, 224),
            precision: str = 'fp32', device: str = 'cuda',
            name: Optional[str] = None) -> MemoryReport:
    """Activation bytes a training step of a model keeps for backward.

    Args:
        spec: what :func:`pola_mm.analysis.zoo.build` builds: a name of
            the zoo, a backbone config dict, an OpenMMLab config file, or
            what :func:`pola_mm.analysis.zoo.counterpart` returns.
        batch: images per step.
        hw: ``(H, W)`` of the (padded) input batch.
        precision: ``'fp32'``, or ``'fp16'``/``'bf16'`` mixed precision
            (CUDA autocast on ``'cuda'``, see the module docstring for
            ``'meta'``).
        device: ``'cuda'`` (fake CUDA tensors: the GPU code path),
            ``'meta'`` or ``'cpu'`` (a real forward).
        name: label of the report (default: derived from ``spec``).

    Returns:
        :class:`MemoryReport`; the model runs in training mode.
    """
    _check_args(batch, hw, precision, device)
    amp = _AMP_DTYPES.get(precision)
    fake_ctx: Any = contextlib.nullcontext()
    if device == 'cuda':
        from torch._subclasses.fake_tensor import FakeTensorMode
        fake_ctx = FakeTensorMode()
    # built on the CPU (some models call .item() while building), then
    # moved: parameters become meta or fake CUDA tensors
    built = build(spec)
    model, forward = built.model, built.forward
    model.train()
    if device != 'cpu':
        model.to('meta')
    with fake_ctx, torch.device(device):
        if device == 'cuda':
            _to_fake_cuda(model, fake_ctx)
        dt = torch.float32
        if device == 'meta' and amp is not None:
            model.to(amp)  # emulation: autocast has no meta backend
            dt = amp
        x = torch.empty(batch, 3, int(hw[0]), int(hw[1]), dtype=dt)
        if device == 'cpu':
            x.normal_()
        if device == 'cuda':
            amp_ctx: Any = _cuda_autocast(amp)
        elif device == 'cpu' and amp is not None:
            amp_ctx = torch.autocast('cpu', dtype=amp)
        elif device == 'meta':
            amp_ctx = _meta_default_dtype(amp)
        else:
            amp_ctx = contextlib.nullcontext()
        with amp_ctx, built.paths():
            saved, extra = measure_saved(model, [x], forward,
                                         efficient_sdpa=device == 'cuda')
    return MemoryReport(
        name=name or _spec_name(spec), device=device, precision=precision,
        batch=batch, hw=(int(hw[0]), int(hw[1])), saved=saved,
        input_bytes=extra['input'], output_bytes=extra['output'],
        param_bytes=extra['param'], freed_bytes=extra['freed'],
        scope=built.kind)


# -- reports -----------------------------------------------------------------
def _mib(n: int) -> str:
    return f'{n / MiB:.1f}'


def format_comparison(pola: MemoryReport,
                      soft: Optional[MemoryReport]) -> str:
    """A markdown table: MiB saved per stage and in all, side by side, with
    the ratio Pola / softmax."""
    a = pola.by_stage()
    b = soft.by_stage() if soft is not None else {}
    rows = list(a) + [k for k in b if k not in a]
    head = f'| part | {pola.name} MiB |'
    sep = '| --- | ---: |'
    if soft is not None:
        head += f' {soft.name} MiB | ratio |'
        sep += ' ---: | ---: |'
    lines = [head, sep]

    def row(label: str, x: int, y: Optional[int]) -> str:
        s = f'| {label} | {_mib(x)} |'
        if soft is not None:
            r = f'{x / y:.2f}' if y else '-'
            s += f' {_mib(y or 0)} | {r} |'
        return s

    for k in rows:
        lines.append(row(k, a.get(k, 0), b.get(k, 0) if soft else None))
    lines.append(row('**total**', pola.total,
                     soft.total if soft is not None else None))
    return '\n'.join(lines)


def format_breakdown(report: MemoryReport, prefix: str = '',
                     top: int = 15) -> str:
    """Per module under ``prefix`` (MiB), then the ``top`` biggest saved
    storages with their op and the line of code that saved them."""
    lines = [f'per module ({report.name}, {prefix or "all"}):', '',
             '| module | MiB |', '| --- | ---: |']
    mods = report.by_module(prefix)
    for m, n in sorted(mods.items(), key=lambda kv: -kv[1]):
        lines.append(f'| {m or "(top)"} | {_mib(n)} |')
    lines += ['', f'biggest saved storages ({prefix or "all"}):', '',
              '| MiB | shape | dtype | op | module | saved at |',
              '| ---: | --- | --- | --- | --- | --- |']
    items = [s for s in report.saved if s.module.startswith(prefix)]
    for s in sorted(items, key=lambda s: -s.nbytes)[:top]:
        lines.append(f'| {_mib(s.nbytes)} | {tuple(s.shape)} | {s.dtype} | '
                     f'{s.op} | {s.module} | {s.where} |')
    return '\n'.join(lines)


def cuda_memory_check(spec: Spec, batch: int = 2,
                      hw: Size2 = (224, 224),
                      precision: str = 'fp32') -> Dict[str, float]:
    """On a real GPU: the estimate of :func:`measure` (``device='cuda'``)
    against what the CUDA caching allocator holds after the forward and at
    its peak over forward + backward.

    One warm-up step runs first (cuBLAS/cuDNN workspaces, autocast's
    caches), then the measured step from a clean slate: ``memory_allocated``
    before the forward (parameters, input, workspaces) is the base.

    Returns:
        MiB: ``estimate`` (saved for backward), ``estimate_outputs`` (plus
        the outputs not saved), ``held_after_forward`` (``memory_allocated``
        after the forward minus the base), ``peak_step``
        (``max_memory_allocated`` over forward + backward minus the base,
        gradients included) and ``ratio`` = held_after_forward /
        estimate_outputs.
    """
    if not torch.cuda.is_available():
        raise RuntimeError('cuda_memory_check needs a CUDA GPU '
                           '(torch.cuda.is_available() is False)')
    _check_args(batch, hw, precision, 'cuda')
    est = measure(spec, batch, hw, precision, 'cuda')
    built = build(spec)
    model, forward = built.model.cuda(), built.forward
    model.train()  # not chained: mmdet's SwinTransformer.train returns None
    x = torch.randn(batch, 3, int(hw[0]), int(hw[1]), device='cuda')
    amp = _AMP_DTYPES.get(precision)

    def step(measured: bool) -> Tuple[int, int]:
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with built.paths(), torch.autocast('cuda', dtype=amp or torch.float16,
                                           enabled=amp is not None):
            out = forward(x)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - base
        loss = sum(t.float().sum() for t in _flat_tensors(out))
        del out
        loss.backward()
        torch.cuda.synchronize()
        return held, torch.cuda.max_memory_allocated() - base

    step(False)
    held, peak = step(True)
    model.zero_grad(set_to_none=True)
    with_out = est.total + est.output_bytes
    res = dict(estimate=est.total / MiB, estimate_outputs=with_out / MiB,
               held_after_forward=held / MiB, peak_step=peak / MiB,
               ratio=held / with_out if with_out else float('nan'))
    print_log(f'{_spec_name(spec)} {precision}: estimate '
              f'{res["estimate_outputs"]:.1f} MiB (outputs included), held '
              f'after forward {res["held_after_forward"]:.1f} MiB, peak '
              f'{res["peak_step"]:.1f} MiB', logger='current')
    return res
