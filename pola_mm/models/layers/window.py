"""Window helpers of Pola-Swin's softmax (``'S'``) stages.

Small pure functions on channel-last maps ``(B, H, W, C)``: padding,
partition into (possibly non-square) windows and back, cyclic shift, Swin's
region mask for shifted windows and a key-validity mask for padded tokens.
Window and shift sizes are ``(height, width)`` tuples of Python ints, so
every function is friendly to ``torch.compile`` (no data-dependent branches).
"""
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ...type_aliases import Pad4, Size2

#: Additive value the authors (and Swin) use for masked attention logits.
MASK_VALUE = -100.0


def effective_window(hw: Size2, window: Size2,
                     shift: Size2) -> Tuple[Size2, Size2]:
    """Window and shift actually used on a map of size ``hw``.

    Per dimension: if the map is not larger than the window, the window
    shrinks to the map and the shift in that dimension is 0 (Swin's rule,
    applied per dimension so non-square maps keep the largest valid window);
    otherwise window and shift are kept.

    Args:
        hw: ``(H, W)`` of the feature map.
        window: ``(wh, ww)`` configured window.
        shift: ``(sh, sw)`` configured shift (0 for unshifted blocks).

    Returns:
        ``((wh', ww'), (sh', sw'))``.
    """
    wh, sh = (hw[0], 0) if hw[0] <= window[0] else (window[0], shift[0])
    ww, sw = (hw[1], 0) if hw[1] <= window[1] else (window[1], shift[1])
    return (wh, ww), (sh, sw)


def grid_padding(hw: Size2, window: Size2) -> Pad4:
    """Bottom/right padding that makes a map a multiple of the window.

    Args:
        hw: ``(H, W)`` of the map.
        window: ``(wh, ww)``.

    Returns:
        ``(top, bottom, left, right)`` with ``top = left = 0``.
    """
    return (0, -hw[0] % window[0], 0, -hw[1] % window[1])


def pad_map(x: Tensor, pad: Pad4) -> Tensor:
    """Zero-pad a channel-last map.

    Args:
        x: ``(B, H, W, C)``.
        pad: ``(top, bottom, left, right)``.

    Returns:
        ``(B, H + top + bottom, W + left + right, C)``; ``x`` itself when
        there is nothing to pad.
    """
    top, bottom, left, right = pad
    if top == 0 and bottom == 0 and left == 0 and right == 0:
        return x
    return F.pad(x, (0, 0, left, right, top, bottom))


def crop_map(x: Tensor, pad: Pad4) -> Tensor:
    """Undo :func:`pad_map`: ``(B, Hp, Wp, C) -> (B, H, W, C)``."""
    top, bottom, left, right = pad
    if top == 0 and bottom == 0 and left == 0 and right == 0:
        return x
    Hp, Wp = x.shape[1], x.shape[2]
    return x[:, top:Hp - bottom, left:Wp - right, :]


def window_partition(x: Tensor, window: Size2) -> Tensor:
    """Split a map into non-overlapping windows.

    Args:
        x: ``(B, H, W, C)`` with ``H % wh == 0`` and ``W % ww == 0``.
        window: ``(wh, ww)``.

    Returns:
        ``(B * nW, wh * ww, C)``; windows ordered batch-major, then row-major
        over the window grid; tokens row-major inside a window.
    """
    B, H, W, C = x.shape
    wh, ww = window
    x = x.view(B, H // wh, wh, W // ww, ww, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, wh * ww, C)


def window_reverse(windows: Tensor, window: Size2, hw: Size2) -> Tensor:
    """Inverse of :func:`window_partition`.

    Args:
        windows: ``(B * nW, wh * ww, C)``.
        window: ``(wh, ww)``.
        hw: ``(H, W)`` of the (padded) map.

    Returns:
        ``(B, H, W, C)``.
    """
    H, W = hw
    wh, ww = window
    C = windows.shape[-1]
    x = windows.view(-1, H // wh, W // ww, wh, ww, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, H, W, C)


def cyclic_shift(x: Tensor, shift: Size2, reverse: bool = False) -> Tensor:
    """Swin's cyclic shift of a channel-last map (``roll`` by ``-shift``).

    Args:
        x: ``(B, H, W, C)`` (or ``(H, W)`` when used for label maps with
            ``dims`` 0, 1: any tensor whose dims 1, 2 are the spatial ones).
        shift: ``(sh, sw)``.
        reverse: roll back by ``+shift``.
    """
    sh, sw = shift
    if sh == 0 and sw == 0:
        return x
    if not reverse:
        sh, sw = -sh, -sw
    return torch.roll(x, shifts=(sh, sw), dims=(1, 2))


def shift_region_mask(padded_hw: Size2, window: Size2, shift: Size2,
                      device: Optional[torch.device] = None,
                      mask_value: float = MASK_VALUE) -> Tensor:
    """Swin's attention mask for cyclically shifted windows.

    After the map is rolled by ``-shift``, the last window row/column holds
    tokens from opposite image borders. Tokens get a region label (Swin's
    slices ``[0, -w)``, ``[-w, -s)``, ``[-s, end)`` per dimension, in rolled
    coordinates) and attention between different labels is masked.

    Args:
        padded_hw: ``(Hp, Wp)``, multiples of the window.
        window: ``(wh, ww)``.
        shift: ``(sh, sw)``.
        device: where to build the mask.
        mask_value: additive logit for masked pairs (the authors' -100).

    Returns:
        ``(nW, wh * ww, wh * ww)`` float mask with 0 and ``mask_value``.
    """
    Hp, Wp = padded_hw
    labels = torch.zeros((1, Hp, Wp, 1), device=device)
    cnt = 0
    for h0, h1 in _regions(Hp, window[0], shift[0]):
        for w0, w1 in _regions(Wp, window[1], shift[1]):
            labels[:, h0:h1, w0:w1, :] = cnt
            cnt += 1
    lw = window_partition(labels, window).squeeze(-1)  # (nW, N)
    diff = lw.unsqueeze(1) - lw.unsqueeze(2)
    return torch.zeros_like(diff).masked_fill(diff != 0, mask_value)


def _regions(size: int, w: int, s: int) -> List[Tuple[int, int]]:
    """Swin's regions ``[0, size - w)``, ``[size - w, size - s)``,
    ``[size - s, size)`` of one dimension (the whole of it without
    shift)."""
    if s == 0:
        return [(0, size)]
    return [(0, size - w), (size - w, size - s), (size - s, size)]


def valid_token_map(hw: Size2, pad: Pad4,
                    device: Optional[torch.device] = None) -> Tensor:
    """Boolean map of real (non-padded) tokens of a padded map.

    Args:
        hw: ``(H, W)`` before padding.
        pad: ``(top, bottom, left, right)``.

    Returns:
        ``(1, Hp, Wp, 1)`` bool, True at real tokens.
    """
    ones = torch.ones((1, hw[0], hw[1], 1), dtype=torch.bool, device=device)
    return pad_map(ones, pad)


def key_valid_mask(valid_map: Tensor, window: Size2) -> Tensor:
    """Per-window key validity from a (possibly rolled) validity map.

    Args:
        valid_map: ``(1, Hp, Wp, 1)`` bool from :func:`valid_token_map`.
        window: ``(wh, ww)``.

    Returns:
        ``(nW, wh * ww)`` bool, True for keys that are real tokens.
    """
    return window_partition(valid_map, window).squeeze(-1)


def key_padding_logits(valid: Tensor,
                       mask_value: float = MASK_VALUE) -> Tensor:
    """Additive attention mask from key validity.

    Args:
        valid: ``(nW, N)`` bool.

    Returns:
        ``(nW, 1, N)`` float: 0 for real keys, ``mask_value`` for padded ones.
    """
    zeros = torch.zeros(valid.shape, device=valid.device)
    return zeros.masked_fill(~valid, mask_value).unsqueeze(1)
