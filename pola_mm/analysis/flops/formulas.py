"""The closed-form FLOPs of the attention ops, and which calls are charged
by formula.

The paper's formulas (1 multiply-add = 1 FLOP, the convention of
:mod:`pola_mm.analysis.flops`): :func:`polarity_attention_flops`
(PolaFormer), :func:`pacs_attention_flops` (PolaFormer++'s PaCS) and
:func:`softmax_attention_flops`. Each attention function returns its terms
(``products``, ``conv``, ``elementwise``), their ``total`` and ``op``:
what the counter charges a call of the op (the depth-wise conv on v is the
module's own conv and is counted as a conv).

:data:`FORMULAS` says which functions the counter charges by formula
instead of by the aten operations they run, filled by
:func:`register_formula`. Registered here:

- :func:`pola_mm.ops.polarity_attention` and its reference
  :func:`~pola_mm.ops.polarity_attention_pytorch` (the fast kernel runs
  inside the op, so it is charged with it; with the fast paths off it does
  not run): ``polarity_attention_flops(...)['op']``;
- :func:`pola_mm.ops.pacs_attention` and
  :func:`~pola_mm.ops.pacs_attention_pytorch`:
  ``pacs_attention_flops(...)['op']``, with the rotary encoding when the
  op is given the map ``hw`` (or the formula rotary tables), and with the
  scaled inputs (``q / s``, ``k + positional_encoding``, ``k / s``) when it
  is given ``scale`` (PolaFormer's ``feature_map='pacs'``);
- :func:`pola_mm.ops.resize_pos_table`: 0, like the rotary tables: they
  depend on the map's size only, not on the image.

These ops report their calls (:func:`pola_mm.ops.reports_calls`), which is
how the counter sees them (:mod:`.counter`).
"""
from typing import Any, Callable, Dict, Optional, Tuple

import torch.nn as nn

from ...ops import (pacs_attention, pacs_attention_pytorch, polarity_attention,
                    polarity_attention_pytorch, resize_pos_table)

__all__ = [
    'polarity_attention_flops', 'pacs_attention_flops',
    'softmax_attention_flops', 'OpFormula', 'FORMULAS', 'register_formula'
]


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


# -- which calls are charged by formula ------------------------------------
#: How a call of a function is charged: ``(label, flops)``, ``label`` its
#: key in :attr:`~.counter.FlopReport.by_op`, ``flops(arguments, caller)``
#: its FLOPs from its arguments by name and the innermost module running
#: (or None).
OpFormula = Tuple[str, Callable[[Dict[str, Any], Optional[nn.Module]], int]]

#: The functions charged by formula (see the module docstring), filled by
#: :func:`register_formula`; keyed by the function the callers call.
FORMULAS: Dict[Callable[..., Any], OpFormula] = {}


def register_formula(label: str, *functions: Callable[..., Any]
                     ) -> Callable[[Callable], Callable]:
    """Decorator: charge every call of ``functions`` the decorated
    ``flops(arguments, caller) -> int`` under ``label``, instead of the aten
    operations the call runs (calls inside another call charged by formula
    are part of that one).

    ``arguments`` are the call's arguments by name, ``caller`` the innermost
    module running (or None). How the counter sees the calls
    (:mod:`.counter`):

    - a function that reports its calls (decorated with
      :func:`pola_mm.ops.reports_calls`, as the public ops; the way for an
      op of one's own): from the arguments it was called with (defaults
      filled in), when it returns, whatever name it is called by;
    - any other Python function: found on the call stack when it runs a
      tensor operation, charged once per call from its parameters as they
      are at its first tensor operation (a call that runs none is not
      charged).
    """
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
    # the op (the formula: its tables) and the scaled inputs of
    # PolarityAttention (q / s, (k + positional table) / s: the op's scale
    # and k_bias)
    rotary = (args.get('hw') is not None or args.get('sin') is not None)
    return pacs_attention_flops(
        *_heads(args), rotary=rotary,
        scaled_inputs=args.get('scale') is not None)['op']


@register_formula('positional_table', resize_pos_table)
def _positional_table(args: Dict[str, Any],
                      caller: Optional[nn.Module]) -> int:
    return 0  # depends on the map's size only, like the rotary tables
