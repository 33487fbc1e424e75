"""Parameters and FLOPs of pola_mm models, the polarity attention included.

Convention (mmengine's ``get_model_complexity_info`` / fvcore, and the
tables of Swin, PVT and PolaFormer): **one multiply-add is one FLOP**, so a
``(m, k) @ (k, n)`` product costs ``m k n`` and a conv ``out_elements *
in_channels / groups * kernel_area``. Normalisation layers cost what
mmengine charges (LayerNorm / GroupNorm 5 per element with an affine
transform, 4 without; BatchNorm in eval 2 per element with affine, 1
without), bilinear upsampling 4 per output element, nearest 1, adaptive
average pooling 1 per input element. Other elementwise work (activations,
residual adds, softmax) is not counted, as in mmengine.

How it counts: a :class:`~torch.utils._python_dispatch.TorchDispatchMode`
sees every aten operation of one forward on a synthetic input, with
pola_mm's fast paths off (:func:`pola_mm.ops.plain_paths`: every op runs
its plain ``*_pytorch`` reference). Some work is charged by formula instead
of by what the dispatcher sees, through a registry of formulas keyed by
the op functions (:data:`FORMULAS`, :func:`register_formula`): while
counting, every module global bound to a registered function is wrapped,
the call is charged its formula from its arguments' shapes, and the aten
operations inside it are not counted; afterwards the globals are restored.
The models know nothing of this. Registered here:

- the polarity attention op (:func:`pola_mm.ops.polarity_attention` and
  its reference :func:`~pola_mm.ops.polarity_attention_pytorch`; the fast
  kernel runs inside the op, so it is charged with it, and with the fast
  paths off it does not run) by :func:`polarity_attention_flops`, its
  matrix products and the elementwise work of the published formula
  (feature maps with the learned power, scalings, normalisers);
- the PaCS attention op (:func:`pola_mm.ops.pacs_attention` and its
  reference :func:`~pola_mm.ops.pacs_attention_pytorch`) by
  :func:`pacs_attention_flops`, with the rotary encoding when
  the op is given rotary tables, and with the scaled inputs (``q / s``,
  ``k + positional_encoding``, ``k / s``) when the module calling it is a
  :class:`~pola_mm.models.layers.PolarityAttention` (PolaFormer's
  ``feature_map='pacs'``, which computes them before the op);
- the positional tables resized to a map
  (:func:`pola_mm.ops.resize_pos_table`): not charged, like the rotary
  tables: they depend on the map's size only, not on the image.

The depth-wise conv on v (``dwc``, ``lepe``) is a conv like any other, so
each attention module costs its projections, the op's formula and its conv:
the published total (``total`` of the formulas). Every
``scaled_dot_product_attention`` kernel (fused softmax attention, which
:class:`torch.utils.flop_counter.FlopCounterMode` counts as 0 on the CPU)
is charged :func:`softmax_attention_flops`: its two products, the same as
the explicit ``q @ k^T`` and ``attn @ v`` of the plain reference.

A two-stage detector's RoI heads are counted on the RoIs of its test pass,
as the published numbers are (:func:`published_rois`): every box head
stage on the RPN's ``max_per_img`` proposals (1000), every mask head the
test pass runs (all three of a cascade) on the ``max_per_img`` detections
(100). ``compute=False`` counts without computing the matrix products and
convolutions (zeros of their shapes): the same count, about twice as fast.

mmengine's counter (``get_model_complexity_info``, used by the upstream
``get_flops.py`` tools) traces the model with ``torch.jit.trace``: it cannot
see into custom autograd functions or C++ loops and has no handler for
``scaled_dot_product_attention``.
"""
import contextlib
import functools
import inspect
import sys
from dataclasses import dataclass, field
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence,
                    Tuple)

import torch
import torch.nn as nn
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from ..models.from_config import build_config_model
from ..models.layers import PolarityAttention
from ..ops import (pacs_attention, pacs_attention_pytorch, plain_paths,
                   polarity_attention, polarity_attention_pytorch)
from ..ops.position import resize_pos_table

__all__ = [
    'FlopReport', 'FORMULAS', 'register_formula', 'polarity_attention_flops',
    'pacs_attention_flops', 'softmax_attention_flops', 'count_flops',
    'count_params', 'model_complexity', 'published_rois', 'format_report',
    'wrapped_globals'
]

aten = torch.ops.aten

Shape = Sequence[int]


def _prod(shape: Shape) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


# -- formulas ------------------------------------------------------------
def polarity_attention_flops(batch: int, tokens: int, embed_dims: int,
                             num_heads: int, kernel_size: int = 5,
                             key_tokens: Optional[int] = None
                             ) -> Dict[str, int]:
    """FLOPs of PolaFormer's polarity attention, the published computation
    of :class:`~pola_mm.models.layers.PolarityAttention` between its
    projections: the op (:func:`pola_mm.ops.polarity_attention`) and the
    depth-wise conv on v.

    With ``B`` = ``batch``, ``N`` = ``tokens`` (the whole stage map), ``n``
    = ``key_tokens`` (default ``N``), ``C`` = ``embed_dims``, ``h`` heads
    of width ``d = C / h``, ``k`` the depth-wise kernel (1 multiply-add = 1
    FLOP):

    - ``products``: key-value state ``k'^T v1`` and ``k'^T v2``
      (``(2d, n) @ (n, d/2)`` per head, twice: ``2 B n C d``), query
      application ``q_sim @ kv1`` and ``q_opp @ kv2`` (``2 B N C d``),
      normalisers ``q_sim . mean(k')`` and ``q_opp . mean(k')``
      (``(N, 2d) @ (2d, 1)`` per head, twice: ``4 B N C``);
    - ``conv``: the depth-wise conv on v, ``B N C k^2``;
    - ``elementwise`` (one FLOP per output element of each arithmetic
      step): on the keys, ``k + positional_encoding`` and ``k / s``
      (``2 B n C``), the powers ``relu(t)^p`` and ``relu(-t)^p`` (``2 B n
      C``; the relu is free), the mean of ``k'`` over the tokens (``2 B n
      C``) and the authors' ``n^-1/2`` scalings of ``k'`` and ``v`` (``3 B
      n C``); on the queries, ``q / s`` (``B N C``), the powers (``2 B N
      C``), the normalisers ``1 / (z + eps)`` (``4 B h N``) and their
      products with the outputs (``B N C``), and the sum of attention and
      conv (``B N C``): ``14 B N C + 4 B h N`` when ``n = N``.

    The projections (``qkvg`` or ``qg`` + ``kv``, ``proj``) are linears
    counted as such, outside this formula.

    Returns:
        dict with ``products``, ``conv``, ``elementwise``, ``total`` (all
        three) and ``op``: what the counter charges the op (``products``
        and ``elementwise``; the conv is counted as the conv it is).
    """
    B, N, C, h = int(batch), int(tokens), int(embed_dims), int(num_heads)
    n = N if key_tokens is None else int(key_tokens)
    d = C // h
    products = 2 * B * n * C * d + 2 * B * N * C * d + 4 * B * N * C
    conv = B * N * C * kernel_size * kernel_size
    elementwise = 9 * B * n * C + 5 * B * N * C + 4 * B * h * N
    return dict(products=products, conv=conv, elementwise=elementwise,
                total=products + conv + elementwise,
                op=products + elementwise)


def pacs_attention_flops(batch: int, tokens: int, embed_dims: int,
                         num_heads: int, kernel_size: int = 5,
                         rotary: bool = False,
                         scaled_inputs: bool = False) -> Dict[str, int]:
    """FLOPs of the PaCS attention (PolaFormer++) plus its depth-wise conv:
    :class:`~pola_mm.models.layers.PaCSAttention` (PolaPP: ``rotary=True``)
    and :class:`~pola_mm.models.layers.PolarityAttention` with
    ``feature_map='pacs'`` (``scaled_inputs=True``: the positional table and
    ``softplus(scale)`` of PolaFormer). ``B``, ``N``, ``C``, ``h``, ``d``,
    ``k`` as in :func:`polarity_attention_flops`:

    - ``products``: the same shapes as PolaFormer's: key-value states
      ``R(k')^T v1``, ``R(k')^T v2`` (``2 B N C d``), query application
      (``2 B N C d``) and the normalisers ``q_sim . mean(k')``,
      ``q_opp . mean(k')`` (``4 B N C``);
    - ``conv``: the depth-wise conv on v (``dwc`` / ``lepe``), ``B N C k^2``;
    - ``elementwise``: the features ``exp(t c) - 1`` of both query flows
      (temperature product and ``expm1`` on ``2C`` channels each:
      ``8 B N C``) and ``exp(c) - 1`` of the keys (``2 B N C``; ``relu``
      and concatenation free), the mean of ``k'`` (``2 B N C``), the
      ``N^-1/2`` scalings of ``k'`` and ``v`` (``3 B N C``), the
      normalisers ``1 / (z + eps)`` (``4 B h N``), their products with the
      outputs (``B N C``) and the sum of attention and conv (``B N C``):
      ``17 B N C + 4 B h N``; with ``rotary``, ``x cos + rot(x) sin`` on
      ``q_sim``, ``q_opp`` and ``k'`` (``3 x 3 x 2 B N C = 18 B N C``; the
      tables depend only on the map and are not counted); with
      ``scaled_inputs``, ``k + positional_encoding``, ``q / s``, ``k / s``
      (``3 B N C``).

    Returns:
        dict with ``products``, ``conv``, ``elementwise``, ``total`` and
        ``op`` (``products`` and ``elementwise``), as
        :func:`polarity_attention_flops`.
    """
    B, N, C, h = int(batch), int(tokens), int(embed_dims), int(num_heads)
    d = C // h
    products = 4 * B * N * C * d + 4 * B * N * C
    conv = B * N * C * kernel_size * kernel_size
    per_token = 17 + (18 if rotary else 0) + (3 if scaled_inputs else 0)
    elementwise = per_token * B * N * C + 4 * B * h * N
    return dict(products=products, conv=conv, elementwise=elementwise,
                total=products + conv + elementwise,
                op=products + elementwise)


def softmax_attention_flops(batch: int, num_heads: int, q_tokens: int,
                            k_tokens: int, head_dims: int,
                            v_head_dims: Optional[int] = None) -> int:
    """FLOPs of softmax attention ``softmax(q k^T) v``: its two products,
    ``B h Nq Nk d + B h Nq Nk dv`` (``batch`` counts windows for windowed
    attention). The softmax, scaling, bias and masks are elementwise and
    not counted (mmengine's convention)."""
    dv = head_dims if v_head_dims is None else v_head_dims
    return int(batch) * int(num_heads) * int(q_tokens) * int(k_tokens) * (
        int(head_dims) + int(dv))


# -- formulas of ops, keyed by the op functions ----------------------------
#: How a call of a function is charged: ``(label, flops)``, ``label`` its
#: key in :attr:`FlopReport.by_op`, ``flops(arguments, caller)`` its FLOPs
#: from its arguments by name and the innermost module running (or None).
OpFormula = Tuple[str, Callable[[Dict[str, Any], Optional[nn.Module]], int]]

#: The functions charged by formula (see the module docstring), filled by
#: :func:`register_formula`.
FORMULAS: Dict[Callable[..., Any], OpFormula] = {}


def register_formula(label: str, *functions: Callable[..., Any]
                     ) -> Callable[[Callable], Callable]:
    """Decorator: charge every call of ``functions`` (a public op and its
    plain reference, or any function of one's own)
    the decorated ``flops(arguments, caller) -> int`` under ``label``,
    instead of the aten operations the call runs. The function is wrapped
    wherever a module global is bound to it, for the duration of a count
    (so it must be called through such a global, as the ops call their
    references)."""
    def register(flops: Callable[[Dict[str, Any], Optional[nn.Module]],
                                 int]) -> Callable:
        for fn in functions:
            FORMULAS[fn] = (label, flops)
        return flops
    return register


def _heads(args: Dict[str, Any]) -> Tuple[int, int, int, int]:
    """``(B, N, C, h)`` of an op's queries ``q`` ``(B, h, N, d)``."""
    B, h, N, d = args['q'].shape
    return B, N, h * d, h


@register_formula('polarity_attention', polarity_attention,
                  polarity_attention_pytorch)
def _polarity_attention(args: Dict[str, Any],
                        caller: Optional[nn.Module]) -> int:
    B, N, C, h = _heads(args)
    return polarity_attention_flops(B, N, C, h,
                                    key_tokens=args['k'].shape[-2])['op']


@register_formula('pacs_attention', pacs_attention,
                  pacs_attention_pytorch)
def _pacs_attention(args: Dict[str, Any],
                    caller: Optional[nn.Module]) -> int:
    # PolarityAttention divides q, k by softplus(scale) and adds its
    # positional table before calling the op: charged here, with the op
    return pacs_attention_flops(
        *_heads(args), rotary=args.get('sin') is not None,
        scaled_inputs=isinstance(caller, PolarityAttention))['op']


@register_formula('positional_table', resize_pos_table)
def _positional_table(args: Dict[str, Any],
                      caller: Optional[nn.Module]) -> int:
    return 0  # depends on the map's size only, like the rotary tables


# -- per-operation handlers (shapes -> FLOPs) ----------------------------
def _mm(args: tuple, out: Any) -> int:
    a, b = args[0], args[1]
    return _prod(a.shape) * b.shape[-1]


def _addmm(args: tuple, out: Any) -> int:
    return _mm(args[1:], out)


def _bmm(args: tuple, out: Any) -> int:
    a, b = args[0], args[1]
    return _prod(a.shape) * b.shape[-1]


def _baddbmm(args: tuple, out: Any) -> int:
    return _bmm(args[1:], out)


def _conv(args: tuple, out: Any) -> int:
    # aten.convolution(input, weight, bias, stride, padding, dilation,
    #                  transposed, output_padding, groups)
    x, w = args[0], args[1]
    transposed = bool(args[6]) if len(args) > 6 else False
    if transposed:  # every input element meets a full kernel
        return _prod(x.shape) * _prod(w.shape[1:])
    return _prod(out.shape) * _prod(w.shape[1:])


def _sdpa(args: tuple, out: Any) -> int:
    q, k, v = args[0], args[1], args[2]
    *lead, nq, d = q.shape
    return softmax_attention_flops(_prod(lead), 1, nq, k.shape[-2], d,
                                   v.shape[-1])


def _norm(affine_index: int) -> Callable[[tuple, Any], int]:
    def handler(args: tuple, out: Any) -> int:
        w = args[affine_index] if len(args) > affine_index else None
        return _prod(args[0].shape) * (5 if w is not None else 4)
    return handler


def _batch_norm(weight_index: int, training: Optional[int]) -> Callable:
    def handler(args: tuple, out: Any) -> int:
        train = bool(args[training]) if training is not None else False
        has_affine = args[weight_index] is not None
        if train:
            return _prod(args[0].shape) * (5 if has_affine else 4)
        return _prod(args[0].shape) * (2 if has_affine else 1)
    return handler


def _first_out(out: Any) -> Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def _per_output(scale: int) -> Callable[[tuple, Any], int]:
    return lambda args, out: scale * _first_out(out).numel()


def _per_input(scale: int) -> Callable[[tuple, Any], int]:
    return lambda args, out: scale * args[0].numel()


def _handlers() -> Dict[Any, Callable[[tuple, Any], int]]:
    table: Dict[str, Callable[[tuple, Any], int]] = {
        'mm': _mm, 'addmm': _addmm, 'bmm': _bmm, 'baddbmm': _baddbmm,
        'convolution': _conv, '_convolution': _conv,
        '_scaled_dot_product_flash_attention_for_cpu': _sdpa,
        '_scaled_dot_product_flash_attention': _sdpa,
        '_scaled_dot_product_efficient_attention': _sdpa,
        '_scaled_dot_product_cudnn_attention': _sdpa,
        '_scaled_dot_product_fused_attention_overrideable': _sdpa,
        'native_layer_norm': _norm(2),
        'native_group_norm': _norm(1),
        'native_batch_norm': _batch_norm(1, 5),
        '_native_batch_norm_legit': _batch_norm(1, 5),
        '_native_batch_norm_legit_no_training': _batch_norm(1, None),
        'upsample_nearest2d': _per_output(1),
        'upsample_bilinear2d': _per_output(4),
        '_adaptive_avg_pool2d': _per_input(1),
        'mean': _per_input(1),  # global average pooling
        'grid_sampler_2d': _per_output(4),
    }
    return {getattr(aten, name): fn for name, fn in table.items()
            if hasattr(aten, name)}


#: aten ops a count with ``compute=False`` does not run (the matrix products,
#: convolutions and fused attention, nearly all the time of a forward):
#: their outputs are zeros of the shape and strides their meta kernels give.
_SHAPE_ONLY = (
    'mm', 'addmm', 'bmm', 'baddbmm', 'convolution', '_convolution',
    '_scaled_dot_product_flash_attention_for_cpu',
    '_scaled_dot_product_flash_attention',
    '_scaled_dot_product_efficient_attention',
    '_scaled_dot_product_cudnn_attention',
    '_scaled_dot_product_fused_attention_overrideable')


def _zeros_of_shape(func: Any, args: tuple, kwargs: dict) -> Any:
    """What ``func(*args, **kwargs)`` returns, as zeros: the op runs on meta
    tensors (shapes only) and its outputs are made real on the inputs'
    device."""
    from torch.utils._pytree import tree_leaves, tree_map
    device = next((t.device for t in tree_leaves((args, kwargs))
                   if isinstance(t, Tensor)), torch.device('cpu'))

    def meta(t: Any) -> Any:
        return t.to('meta') if isinstance(t, Tensor) else t

    def real(t: Any) -> Any:
        if not isinstance(t, Tensor):
            return t
        return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype,
                                   device=device).zero_()

    return tree_map(real, func(*tree_map(meta, args),
                               **tree_map(meta, kwargs)))


# -- the counter -----------------------------------------------------------
@dataclass
class FlopReport:
    """What one counted forward found.

    Attributes:
        total: FLOPs of the whole forward.
        by_module: FLOPs per module name (``''`` is the root), each
            including its submodules. An operation is charged to the
            innermost module whose ``__call__`` is running, so work done in a
            method called directly (mmdet's ``roi_head.forward``) outside
            any submodule goes to the nearest caller module.
        by_op: FLOPs per operation: aten op names, and the labels of the
            functions charged by formula (:data:`FORMULAS`:
            ``'polarity_attention'``, ``'pacs_attention'``).
        params: parameters per module name, each including its submodules.
        uncounted: aten ops seen but not charged (elementwise and
            data-movement ops, by convention) with how often they ran.
        rois: for a two-stage detector counted by :func:`model_complexity`,
            the RoIs per image its heads ran on: ``proposals`` (each box
            head stage) and ``detections`` (each mask head), see
            :func:`published_rois`; empty otherwise.
    """
    total: int = 0
    by_module: Dict[str, int] = field(default_factory=dict)
    by_op: Dict[str, int] = field(default_factory=dict)
    params: Dict[str, int] = field(default_factory=dict)
    uncounted: Dict[str, int] = field(default_factory=dict)
    rois: Dict[str, int] = field(default_factory=dict)


class _Counter(TorchDispatchMode):
    """Charges each aten op to the modules on the current call stack, and
    the calls of :data:`FORMULAS` by their formulas."""

    def __init__(self, report: FlopReport, model: nn.Module,
                 compute: bool = True) -> None:
        super().__init__()
        self.shape_only = set() if compute else {
            getattr(aten, name) for name in _SHAPE_ONLY
            if hasattr(aten, name)}
        self.report = report
        self.stack: List[str] = ['']  # the root, however it is called
        self.modules = dict(model.named_modules())
        self.own: Dict[str, int] = {}
        self.suppress = 0  # inside a call charged by formula
        self.handlers = _handlers()

    def add(self, op: str, flops: int) -> None:
        r = self.report
        r.total += flops
        r.by_op[op] = r.by_op.get(op, 0) + flops
        # the innermost module called through __call__; totals including
        # submodules are summed by name afterwards (methods such as
        # ``roi_head.forward`` called directly still count for their parent)
        name = self.stack[-1]
        self.own[name] = self.own.get(name, 0) + flops

    def caller(self) -> Optional[nn.Module]:
        """The innermost module running."""
        return self.modules.get(self.stack[-1])

    def finish(self, names: Sequence[str]) -> None:
        """Fill ``report.by_module``: each module's FLOPs including those
        of its submodules."""
        by_module = dict.fromkeys(names, 0)
        for name, flops in self.own.items():
            parts = name.split('.') if name else []
            for i in range(len(parts) + 1):
                key = '.'.join(parts[:i])
                by_module[key] = by_module.get(key, 0) + flops
        self.report.by_module = by_module

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in self.shape_only:
            out = _zeros_of_shape(func, args, kwargs or {})
        else:
            out = func(*args, **(kwargs or {}))
        if self.suppress:
            return out
        handler = self.handlers.get(func.overloadpacket)
        if handler is None:
            name = func.overloadpacket.__name__
            self.report.uncounted[name] = self.report.uncounted.get(
                name, 0) + 1
        else:
            self.add(func.overloadpacket.__name__, int(handler(args, out)))
        return out


@contextlib.contextmanager
def _tracked(model: nn.Module, counter: _Counter) -> Iterator[None]:
    """Module-stack hooks on every submodule."""
    handles = []
    for name, module in model.named_modules():
        if not name:  # the root is always on the stack
            continue

        def pre(m, a, name=name):
            counter.stack.append(name)

        def post(m, a, o, name=name):
            if counter.stack and counter.stack[-1] == name:
                counter.stack.pop()

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _bindings(fns: Sequence[Callable[..., Any]]
              ) -> List[Tuple[Any, str, Callable[..., Any]]]:
    """Every ``(module, name, fn)`` whose module global ``name`` is one of
    ``fns``."""
    by_id = {id(fn): fn for fn in fns}
    out = []
    for module in list(sys.modules.values()):
        try:
            items = list(vars(module).items())
        except TypeError:  # not a module with a namespace
            continue
        out.extend((module, name, by_id[id(v)]) for name, v in items
                   if id(v) in by_id)
    return out


def _charged(fn: Callable[..., Any], label: str,
             flops: Callable[[Dict[str, Any], Optional[nn.Module]], int],
             counter: _Counter) -> Callable[..., Any]:
    """``fn``, charged ``flops`` of its arguments unless it runs inside
    another call charged by formula; its aten operations not counted."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def charged(*args: Any, **kwargs: Any) -> Any:
        outer = counter.suppress == 0
        counter.suppress += 1
        try:
            out = fn(*args, **kwargs)
        finally:
            counter.suppress -= 1
        if outer:
            n = int(flops(signature.bind(*args, **kwargs).arguments,
                          counter.caller()))
            if n:
                counter.add(label, n)
        return out

    return charged


@contextlib.contextmanager
def wrapped_globals(wrappers: Dict[Callable[..., Any], Callable[..., Any]]
                    ) -> Iterator[None]:
    """Every module global bound to a key of ``wrappers`` replaced by its
    value, restored on exit: how the calls of an op are observed (charged
    here, their inputs captured by :func:`~.attention.capture.op_calls`)
    without touching the code that calls it."""
    patched = _bindings(list(wrappers))
    try:
        for module, name, fn in patched:
            setattr(module, name, wrappers[fn])
        yield
    finally:
        for module, name, fn in reversed(patched):
            setattr(module, name, fn)


def _formulas(counter: _Counter) -> contextlib.AbstractContextManager:
    """Every module global bound to a function of :data:`FORMULAS`
    replaced by its charged wrapper, restored on exit."""
    return wrapped_globals({fn: _charged(fn, label, flops, counter)
                            for fn, (label, flops) in FORMULAS.items()})


def count_params(model: nn.Module) -> Dict[str, int]:
    """Parameters per module name (``''`` the root), each including its
    submodules; shared parameters are counted once."""
    out: Dict[str, int] = {}
    for name, module in model.named_modules():
        seen = {id(p): p.numel() for p in module.parameters()}
        out[name] = sum(seen.values())
    return out


def count_flops(model: nn.Module, forward: Callable[[], Any],
                fast_paths: bool = False, compute: bool = True
                ) -> FlopReport:
    """Count the FLOPs of ``forward()``, a call that runs ``model`` (or a
    part of it) once; see the module docstring for the convention.

    Args:
        model: the module whose submodules are attributed (names as in
            ``model.named_modules()``).
        forward: runs the forward pass, e.g. ``lambda: model(x)``.
        fast_paths: leave pola_mm's fast paths as they are (default: off
            while counting, every op runs its reference). The ops of
            :data:`FORMULAS` are charged by formula either way: the public
            ops are registered, and their fast kernels run inside them.
        compute: False: do not compute the matrix products, convolutions
            and fused attention (their outputs are zeros of the right shape
            and strides, from their meta kernels), which is nearly all the
            time a forward takes. The count is the same as long as no shape
            depends on the values, as in classifiers, segmentors and
            detectors counted by :func:`model_complexity` (whose RoI counts
            are fixed, :func:`published_rois`); the outputs are meaningless.

    Returns:
        a :class:`FlopReport` (``params`` filled from ``model``).
    """
    report = FlopReport(params=count_params(model))
    counter = _Counter(report, model, compute=compute)
    paths = contextlib.nullcontext() if fast_paths else plain_paths()
    with paths, _tracked(model, counter), _formulas(counter), counter:
        forward()
    counter.finish([name for name, _ in model.named_modules()])
    return report


# -- whole models from configs ----------------------------------------------
def _scope_of(cfg: Any) -> str:
    return cfg.get('default_scope') or 'mmengine'


def _fake_sample(scope: str, shape: Tuple[int, int]) -> Any:
    meta = dict(img_shape=shape, ori_shape=shape, pad_shape=shape,
                batch_input_shape=shape, scale_factor=(1.0, 1.0),
                flip=False, flip_direction=None)
    if scope == 'mmdet':
        from mmdet.structures import DetDataSample
        return DetDataSample(metainfo=meta)
    if scope == 'mmseg':
        from mmseg.structures import SegDataSample
        return SegDataSample(metainfo=meta)
    return None


def _max_per_img(test_cfg: Any) -> Optional[int]:
    """``max_per_img`` (``max_num`` in old configs) of a head's test
    settings, or None."""
    if test_cfg is None:
        return None
    for key in ('max_per_img', 'max_num'):
        value = test_cfg.get(key) if hasattr(test_cfg, 'get') else None
        if value:
            return int(value)
    return None


def _first_per_image(rois: Tensor, n: int) -> Tuple[Tensor, Tensor]:
    """The first ``n`` RoIs ``(k, 5)`` (``[image, x1, y1, x2, y2]``) of
    each image, in order, and for every RoI the index of a kept RoI of its
    image (itself if kept), to give results back in the caller's shape."""
    keep, back = [], torch.zeros(len(rois), dtype=torch.long,
                                 device=rois.device)
    offset = 0
    for i in torch.unique(rois[:, 0], sorted=True):
        rows = torch.nonzero(rois[:, 0] == i).flatten()
        kept = rows[:n]
        keep.append(kept)
        back[rows] = offset + torch.arange(
            len(rows), device=rois.device) % len(kept)
        offset += len(kept)
    if not keep:
        return rois, back
    return rois[torch.cat(keep)], back


@contextlib.contextmanager
def published_rois(model: nn.Module) -> Iterator[Dict[str, int]]:
    """While active, a two-stage mmdet detector's ``_forward`` runs its RoI
    heads on as many RoIs as its test pass does at most, the convention of
    the published FLOPs (mmdet's ``get_flops.py``, the Swin paper;
    docs/flops.md):

    - the RPN's proposals are exactly ``test_cfg.rpn.max_per_img`` per image
      (1000 in mmdet's configs; the RPN's own proposals, cut or repeated to
      that number, so that random weights do not change the count), and
      every box head stage runs on them (cascade: each stage on the boxes
      the previous one refined, as in ``predict``);
    - every mask head the test pass runs (cascade: the mask head of each
      stage, whose predictions ``predict_mask`` averages) runs on
      ``test_cfg.rcnn.max_per_img`` RoIs per image (100): the final
      detections, here the first proposals.

    Post-processing (NMS, box decoding) is not counted, as before; masks
    are not pasted in ``_forward``. Yields a dict filled with ``proposals``
    and ``detections`` (per image; not more detections than proposals)
    where they apply; a model without ``rpn_head`` / ``roi_head`` runs
    unchanged.
    """
    used: Dict[str, int] = {}
    patched: List[Tuple[nn.Module, str]] = []
    rpn_head = getattr(model, 'rpn_head', None)
    roi_head = getattr(model, 'roi_head', None)
    proposals = _max_per_img(getattr(rpn_head, 'test_cfg', None))
    detections = _max_per_img(getattr(roi_head, 'test_cfg', None))
    if rpn_head is not None and proposals and hasattr(rpn_head, 'predict'):
        predict = rpn_head.predict

        @functools.wraps(predict)
        def fixed_proposals(*args: Any, **kwargs: Any) -> Any:
            results = predict(*args, **kwargs)
            out = []
            for res in results:
                n, device = len(res), res.bboxes.device
                if n == 0:  # no box at all: one box of the whole image
                    h, w = res.metainfo.get('img_shape', (1, 1))[:2]
                    res = type(res)(
                        metainfo=res.metainfo,
                        bboxes=torch.tensor([[0., 0., float(w), float(h)]],
                                            device=device),
                        scores=torch.ones(1, device=device),
                        labels=torch.zeros(1, dtype=torch.long,
                                           device=device))
                    n = 1
                out.append(res[torch.arange(proposals, device=device) % n])
            return out

        rpn_head.predict = fixed_proposals
        patched.append((rpn_head, 'predict'))
        used['proposals'] = proposals
    if roi_head is not None and detections and \
            getattr(roi_head, 'with_mask', False):
        mask_forward = roi_head._mask_forward
        signature = inspect.signature(mask_forward)

        @functools.wraps(mask_forward)
        def on_detections(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            rois = bound.arguments.get('rois')
            if rois is None:
                return mask_forward(*args, **kwargs)
            kept, back = _first_per_image(rois, detections)
            bound.arguments['rois'] = kept
            results = mask_forward(*bound.args, **bound.kwargs)
            if len(kept) == len(rois) or not isinstance(results, dict):
                return results
            # the caller (cascade's forward) splits the results by its
            # proposals: one row per RoI again (copies, not counted)
            return {k: v[back] if isinstance(v, Tensor) and v.dim()
                    and v.shape[0] == len(kept) else v
                    for k, v in results.items()}

        roi_head._mask_forward = on_detections
        patched.append((roi_head, '_mask_forward'))
        used['detections'] = min(detections, proposals or detections)
    try:
        yield used
    finally:
        for module, name in patched:
            delattr(module, name)  # the class's method again


def model_complexity(cfg: Any, shape: Tuple[int, int], batch: int = 1,
                     compute: bool = True
                     ) -> Tuple[nn.Module, FlopReport, str]:
    """Build the model of an mmdet / mmseg / mmpretrain config and count one
    forward on a synthetic ``(batch, 3, H, W)`` input (no dataset, no
    weights loaded, eval mode).

    What runs is what mmdet's, mmseg's and mmpretrain's ``get_flops.py``
    run: a classifier's ``mode='tensor'`` forward (backbone, neck, head
    logits); a detector's ``_forward`` with a synthetic data sample,
    without post-processing; a two-stage detector's RoI heads on the
    RoIs of its test pass, as the published numbers count them
    (:func:`published_rois`: every box head stage on the RPN's 1000
    proposals, every mask head the test pass runs on the 100 detections);
    a segmentor's ``_forward`` (backbone, neck, decode head; the auxiliary
    head, unused at test time, is not run). The input is used as given, no
    padding by the data preprocessor.

    Args:
        cfg: an :class:`mmengine.config.Config` with ``model`` and
            ``default_scope``.
        shape: ``(H, W)``.
        batch: images in the synthetic batch.
        compute: False: shapes only for the products and convolutions
            (:func:`count_flops`), the same count in about half the time.

    Returns:
        the model, its :class:`FlopReport`, and the kind of forward run
        (``'classifier'``, ``'detector'``, ``'segmentor'`` or
        ``'backbone'``).
    """
    H, W = int(shape[0]), int(shape[1])
    if H <= 0 or W <= 0 or batch <= 0:
        raise ValueError(f'shape {shape} and batch {batch} must be positive '
                         '(e.g. --shape 224 224)')
    scope = _scope_of(cfg)
    if cfg.get('model') is None:
        raise ValueError('the config has no `model` to count')
    model = build_config_model(cfg)
    model.eval()
    x = torch.randn(batch, 3, H, W)
    from mmengine.model import BaseModel
    if isinstance(model, BaseModel) and scope in ('mmdet', 'mmseg'):
        kind = 'detector' if scope == 'mmdet' else 'segmentor'
        samples = [_fake_sample(scope, (H, W)) for _ in range(batch)]

        def forward():
            return model._forward(x, samples)
    elif isinstance(model, BaseModel):
        kind = 'classifier' if scope == 'mmpretrain' else 'model'

        def forward():
            return model(x, mode='tensor')
    else:
        kind = 'backbone'

        def forward():
            return model(x)

    rois = published_rois(model) if kind == 'detector' else \
        contextlib.nullcontext({})
    with torch.no_grad(), rois as used:
        report = count_flops(model, forward, compute=compute)
    report.rois = dict(used)
    return model, report, kind


def _fmt(n: float, unit: str) -> str:
    return f'{n / 1e9:.2f} G' if unit == 'G' else f'{n / 1e6:.2f} M'


def format_report(report: FlopReport, kind: str, shape: Tuple[int, int],
                  parts: Sequence[str] = ('backbone', 'neck', 'rpn_head',
                                          'roi_head', 'decode_head', 'head',
                                          'bbox_head')) -> str:
    """A short table: whole model and its top-level parts, FLOPs (G, 1
    multiply-add = 1 FLOP) and parameters (M)."""
    H, W = shape
    lines = [f'input: 1 x 3 x {H} x {W} ({kind}; 1 FLOP = 1 multiply-add)',
             f'{"module":<14} {"FLOPs":>11} {"params":>10}']
    rows = [('model', '')] + [(p, p) for p in parts
                              if p in report.params]
    for label, name in rows:
        flops = _fmt(report.by_module.get(name, 0), 'G')
        params = _fmt(report.params.get(name, 0), 'M')
        lines.append(f'{label:<14} {flops:>11} {params:>10}')
    if report.rois:
        lines.append('RoI heads: each box head stage on '
                     f'{report.rois.get("proposals", "its")} proposals, each '
                     f'mask head on {report.rois.get("detections", "its")} '
                     'detections per image (the test pass at most; '
                     'docs/flops.md)')
    for op, label in (('polarity_attention', 'polarity attention'),
                      ('pacs_attention', 'PaCS attention')):
        if report.by_op.get(op):
            lines.append(f'of which {label} (formula): '
                         f'{_fmt(report.by_op[op], "G")} (its depth-wise '
                         'conv on v counted as a conv)')
    return '\n'.join(lines)
