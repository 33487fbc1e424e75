"""Window helpers of Pola-Swin's softmax (``'S'``) stages.

Small pure functions on channel-last maps ``(B, H, W, C)``: padding,
partition into (possibly non-square) windows and back, Swin's region mask
for shifted windows and a key-validity mask for padded tokens; the cyclic
shift is an op (:func:`~pola_mm.ops.cyclic_shift.cyclic_shift`: one
``roll`` in eager mode, a gather in captured graphs), used from here.
Window sizes are ``(height, width)`` tuples of Python ints. Map sizes,
paddings and shifts may be Python ints or the 0-d tensors a traced graph
gives for shapes: no function branches on them (pads of 0 pad nothing, a
shift of 0 shifts nothing, masks are computed with ``arange`` from the
sizes), so a graph traced at one input size (ONNX export with a dynamic
height/width) computes the same at every other, and ``torch.compile`` sees
no data-dependent branch.

Sizes that are Python ints are concrete (eager mode, or a graph specialised
to this size anyway): there the helpers skip what does nothing and keep
masks in their broadcastable form: :func:`pad_map` and :func:`crop_map`
return the map itself for a padding of zeros, :func:`cyclic_shift` leaves
a dimension shifted by 0 alone, and :func:`window_masks` gives one
``(1, N, N)`` zero mask where nothing is masked. A traced size (a 0-d
tensor, a symbolic int) always takes the branch-free form.
"""
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ...ops.cyclic_shift import cyclic_shift
from ...ops.symbolic_sizes import contiguous, exporting_symbolic
from ...type_aliases import Pad4, Size2

#: Additive value the authors (and Swin) use for masked attention logits.
MASK_VALUE = -100.0


def exceeds(size, limit: int):
    """``1`` where ``size > limit``, else ``0``, without a branch on
    ``size``: a Python int for an int; a 0-d long tensor for the size of a
    captured graph (a traced graph's 0-d tensor, or a symbolic int under
    ``torch.export``, which becomes a graph value through ``torch.full``
    instead of a symbolic comparison: a ``SymBool`` neither multiplies nor
    becomes a tensor, and guards on it would fix the size)."""
    if isinstance(size, int):
        return int(size > limit)
    if not isinstance(size, Tensor):  # a symbolic int
        size = torch.full((), size, dtype=torch.long)
    return (size - limit).clamp(0, 1)


def either(a, b):
    """``max(a, b)`` of two 0/1 flags from :func:`exceeds`."""
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return torch.maximum(torch.as_tensor(a), torch.as_tensor(b))


def grid_padding(hw: Size2, window: Size2) -> Pad4:
    """Bottom/right padding that makes a map a multiple of the window.

    Args:
        hw: ``(H, W)`` of the map.
        window: ``(wh, ww)``.

    Returns:
        ``(top, bottom, left, right)`` with ``top = left = 0``.
    """
    # ceil(H / w) * w - H, not -H % w: the same numbers, and under
    # torch.export a floor division that the symbolic sizes of the later
    # reshapes simplify (nested Mod terms made its solver take minutes)
    return (0, (hw[0] + window[0] - 1) // window[0] * window[0] - hw[0], 0,
            (hw[1] + window[1] - 1) // window[1] * window[1] - hw[1])


def known_zeros(sizes: Sequence) -> bool:
    """Whether ``sizes`` (a padding, a shift: ints or traced sizes) are
    known to be zeros: every entry a Python int 0. False for a traced
    size, whatever its value at the traced input, so a captured graph keeps
    its pad, shift and masks."""
    return all(isinstance(s, int) and s == 0 for s in sizes)


def pad_map(x: Tensor, pad: Pad4) -> Tensor:
    """Zero-pad a channel-last map (``x`` itself for a padding of int 0s).

    Args:
        x: ``(B, H, W, C)``.
        pad: ``(top, bottom, left, right)`` (0 pads nothing).

    Returns:
        ``(B, H + top + bottom, W + left + right, C)``.
    """
    if known_zeros(pad):
        return x
    top, bottom, left, right = pad
    return F.pad(x, (0, 0, left, right, top, bottom))


def crop_map(x: Tensor, pad: Pad4) -> Tensor:
    """Undo :func:`pad_map`: ``(B, Hp, Wp, C) -> (B, H, W, C)`` (``x`` itself
    for a padding of int 0s)."""
    if known_zeros(pad):
        return x
    top, bottom, left, right = pad
    Hp, Wp = x.shape[1], x.shape[2]
    if exporting_symbolic(Hp, Wp):
        # an index_select, not a slice: torch.export cannot prove that the
        # slice's end (H) lies within the padded size (7 * ceil(H / 7))
        rows = torch.arange(Hp - top - bottom, device=x.device) + top
        cols = torch.arange(Wp - left - right, device=x.device) + left
        return x.index_select(1, rows).index_select(2, cols)
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
    return contiguous(x.permute(0, 1, 3, 2, 4, 5)).view(-1, wh * ww, C)


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
    return contiguous(x.permute(0, 1, 3, 2, 4, 5)).view(-1, H, W, C)


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
        shift: ``(sh, sw)``; a dimension without shift has no masked pairs.
        device: where to build the mask.
        mask_value: additive logit for masked pairs (the authors' -100).

    Returns:
        ``(nW, wh * ww, wh * ww)`` float mask with 0 and ``mask_value``.
    """
    rows = _regions(padded_hw[0], window[0], shift[0], device)
    cols = _regions(padded_hw[1], window[1], shift[1], device)
    labels = (rows[:, None] * 3 + cols[None, :]).to(torch.float32)
    lw = window_partition(labels[None, :, :, None], window).squeeze(-1)
    diff = lw.unsqueeze(1) - lw.unsqueeze(2)  # (nW, N, N)
    return torch.zeros_like(diff).masked_fill(diff != 0, mask_value)


def _regions(size: int, w: int, s: int,
             device: Optional[torch.device] = None) -> Tensor:
    """``(size,)`` Swin's region of each index of one dimension: 0 in
    ``[0, size - w)``, 1 in ``[size - w, size - s)``, 2 in ``[size - s,
    size)``. Without shift (``s = 0``) the last window row is region 1
    and the rest 0, which masks nothing (``size`` is a multiple of ``w``:
    no window crosses the border)."""
    i = torch.arange(size, device=device)
    return (i >= size - w).long() + (i >= size - s).long()


def valid_token_map(hw: Size2, pad: Pad4,
                    device: Optional[torch.device] = None) -> Tensor:
    """Boolean map of real (non-padded) tokens of a padded map.

    Args:
        hw: ``(H, W)`` before padding.
        pad: ``(top, bottom, left, right)``.

    Returns:
        ``(1, Hp, Wp, 1)`` bool, True at real tokens.
    """
    top, bottom, left, right = pad
    rows = torch.arange(hw[0] + top + bottom, device=device) - top
    cols = torch.arange(hw[1] + left + right, device=device) - left
    valid = (((rows >= 0) & (rows < hw[0]))[:, None]
             & ((cols >= 0) & (cols < hw[1]))[None, :])
    return valid[None, :, :, None]


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


def window_masks(hw: Size2, window: Size2, shift: Size2,
                 padded_keys_attended: Union[bool, int, Tensor],
                 device: Optional[torch.device] = None,
                 mask_value: float = MASK_VALUE) -> Tensor:
    """The additive masks of the windows of a map padded to a multiple of
    the window and cyclically shifted: Swin's shifted-region mask plus, for
    padded keys, ``mask_value`` unless ``padded_keys_attended``.

    Args:
        hw: ``(H, W)`` before padding (ints or traced sizes).
        window: ``(wh, ww)``.
        shift: ``(sh, sw)`` the map was shifted by (ints or traced sizes).
        padded_keys_attended: True (or 1: an int, a 0-d tensor or a
            symbolic int of a captured graph) where padded tokens are
            attended to like any other key (mmdet's Swin), False (or 0)
            where they are masked.
        device: where to build the masks.
        mask_value: additive logit of a masked pair.

    Returns:
        ``(nW, wh * ww, wh * ww)`` float: 0, ``mask_value`` or twice it; or
        ``(1, wh * ww, wh * ww)`` zeros, broadcast over the windows, where
        int sizes show that nothing is masked (no shift, and padded keys
        attended or no padding).
    """
    pad = grid_padding(hw, window)
    if known_zeros(shift) and (padded_keys_attended is True
                                or (padded_keys_attended is False
                                    and known_zeros(pad))):
        n = window[0] * window[1]
        return torch.zeros(1, n, n, device=device)
    padded_hw = (hw[0] + pad[1], hw[1] + pad[3])
    region = shift_region_mask(padded_hw, window, shift, device, mask_value)
    if padded_keys_attended is True:  # (eager, one or more windows)
        return region
    valid = cyclic_shift(valid_token_map(hw, pad, device), shift)
    keys = key_padding_logits(key_valid_mask(valid, window), mask_value)
    if padded_keys_attended is False:
        return region + keys
    # a 0/1 flag (int, 0-d tensor or symbolic int): no branch on it
    return region + keys * (1 - padded_keys_attended)
