"""Shape checks of the ops' inputs, written once: each op calls them
before it computes, and a wrong input gets a ``TypeError`` or
``ValueError`` naming the expected and the received shapes (sizes that are
symbolic while a graph is captured are not compared, so the checks add no
guard or node to a captured graph).
"""
from typing import Tuple

import torch
from torch import Tensor

from .dispatch import capturing

__all__ = ['check_head_inputs', 'check_broadcastable', 'check_token_grid',
           'param_shape', 'no_queries', 'sizes_differ']


def no_queries(q: Tensor) -> bool:
    """Whether ``q`` ``(B, h, N, d)`` has no tokens (``N == 0``, a plain
    int): the ops then return an empty output without computing."""
    return _static(q.shape[2]) and q.shape[2] == 0


def _static(*sizes) -> bool:
    """Whether every size is a plain int: sizes that are symbolic while a
    graph is captured (``torch.compile``/``torch.export`` with dynamic
    shapes, tensors under ``torch.jit.trace``) are not compared, so the
    checks add no guard or node to the graph."""
    return all(type(s) is int for s in sizes)


def sizes_differ(a, b) -> bool:
    """``a != b`` for plain ints; False when either is symbolic."""
    return _static(a, b) and a != b


def check_token_grid(owner: str, x: Tensor, hw: Tuple[int, int],
                     channels: int) -> None:
    """``x`` must be ``(B, H*W, channels)`` for ``hw = (H, W)``; a
    ``ValueError`` from ``owner`` names the expected and received shapes.

    The rank is always checked; the sizes in eager mode (under graph
    capture they may be symbolic and are not compared: no guard, no node);
    nothing on a ``torch.fx`` proxy."""
    if isinstance(x, torch.fx.Proxy):
        return
    try:
        H, W = hw
    except (TypeError, ValueError):
        raise ValueError(f'{owner}: hw must be (H, W), the grid of the '
                         f'tokens; got {hw!r}') from None
    if not isinstance(x, Tensor):
        raise TypeError(f'{owner}: x must be a tensor (B, H*W, C); got '
                        f'{type(x).__name__}')
    if x.dim() == 3 and (capturing() or not (
            sizes_differ(x.shape[1], H * W)
            or sizes_differ(x.shape[2], channels))):
        return
    raise ValueError(
        f'{owner}: x must be (B, H*W, C) = (B, {H * W}, {channels}) for '
        f'hw=({H}, {W}); got {tuple(x.shape)}')


def _shape(t: Tensor) -> Tuple:
    return tuple(t.shape)


def param_shape(q: Tensor, width: int = 1) -> Tuple:
    """``(1, h, 1, width * d)`` for the queries ``q`` ``(B, h, N, d)``."""
    return (1, q.shape[1], 1, width * q.shape[3])


def check_head_inputs(op: str, q: Tensor, k: Tensor, v: Tensor,
                      same_length: str = '', eager: bool = True) -> None:
    """Check ``q`` ``(B, h, N, d)`` with ``d`` even and ``k``, ``v``
    ``(B, h, n, d)`` (``n == N`` when ``same_length``, the reason, is
    given); raise a ``ValueError`` naming the expected and the received
    shapes.

    Ranks are always checked; sizes only where they are plain ints (all of
    them in eager mode; symbolic ones under graph capture, where ``eager``
    is ``not capturing()``, are skipped). Nothing runs on a ``torch.fx``
    proxy. In eager mode a valid call costs a few tuple comparisons."""
    if isinstance(q, torch.fx.Proxy):
        return
    for name, t in (('q', q), ('k', k), ('v', v)):
        if not isinstance(t, Tensor):
            raise TypeError(f'{op}: {name} must be a tensor (B, h, '
                            f"{'N' if name == 'q' or same_length else 'n'}, "
                            f'd); got {type(t).__name__}')
    for name, t in (('q', q), ('k', k), ('v', v)):
        if not t.is_floating_point():
            raise TypeError(f'{op}: {name} must be a floating-point tensor '
                            f'(float32, float16, bfloat16 or float64); got '
                            f'{t.dtype}: convert it first, e.g. '
                            f'{name}.float()')
    qs, ks, vs = q.shape, k.shape, v.shape
    if eager and len(qs) == len(ks) == len(vs) == 4 and ks[2] != 0:
        # eager: every size is an int; the common, valid case in one test
        if (qs[3] % 2 == 0 and ks == vs and ks[0] == qs[0]
                and ks[1] == qs[1] and ks[3] == qs[3]
                and (not same_length or ks[2] == qs[2])):
            return
    _check_heads(op, q, k, v, same_length)


def _check_heads(op: str, q: Tensor, k: Tensor, v: Tensor,
                 same_length: str) -> None:
    """The checks of :func:`check_head_inputs` one by one, for the
    message (and under graph capture, on the static sizes only)."""
    n = 'N' if same_length else 'n'
    for name, t, length in (('q', q, 'N'), ('k', k, n), ('v', v, n)):
        if t.dim() != 4:
            raise ValueError(f'{op}: {name} must be 4-D (B, h, {length}, d) '
                             f'(heads split off the channels); got '
                             f'{_shape(t)}')
    B, h, N, d = q.shape
    if _static(d) and d % 2:
        raise ValueError(f'{op}: the head width d must be even (v is split '
                         f'into two halves per head); got q {_shape(q)}, '
                         f'd = {d}')
    if _static(k.shape[2]) and k.shape[2] == 0:
        raise ValueError(f'{op}: k and v need at least one token (each '
                         f'flow is normalised by a mean over the keys); '
                         f'got k {_shape(k)}, v {_shape(v)}')
    want = (B, h, N if same_length else k.shape[2], d)
    for t in (k, v):
        if any(sizes_differ(a, b) for a, b in zip(t.shape, want)):
            want_text = (f'({B}, {h}, {N}, {d})' if same_length else
                         f'({B}, {h}, n, {d})')
            raise ValueError(
                f'{op}: k and v must be (B, h, {n}, d) = {want_text} for q '
                f'{_shape(q)}' + (f' ({same_length})' if same_length else '')
                + f'; got k {_shape(k)}, v {_shape(v)}')


def check_broadcastable(op: str, name: str, t: Tensor, what: str,
                        target: Tuple, eager: bool = True,
                        exact: bool = False) -> None:
    """Check that ``t`` broadcasts to ``target`` (described as ``what``)
    without growing it (with ``exact``: that it is of shape ``target``);
    raise a ``ValueError`` naming both shapes (sizes compared only where
    they are plain ints, as :func:`check_head_inputs`)."""
    if isinstance(t, torch.fx.Proxy):
        return
    if not isinstance(t, Tensor):
        raise TypeError(f'{op}: {name} must be a tensor broadcastable to '
                        f'{what} = {tuple(target)}; got {type(t).__name__}')
    shape = t.shape
    if eager and shape == target:  # the common case (ints only)
        return
    if exact:
        if len(shape) != len(target) or any(
                sizes_differ(a, b) for a, b in zip(shape, target)):
            raise ValueError(f'{op}: {name} must be {what} = '
                             f'{tuple(target)}; got {_shape(t)}')
    elif len(shape) > len(target) or any(
            sizes_differ(a, 1) and sizes_differ(a, b)
            for a, b in zip(reversed(shape), reversed(target))):
        raise ValueError(f'{op}: {name} must be broadcastable to {what} = '
                         f'{tuple(target)}; got {_shape(t)}')
