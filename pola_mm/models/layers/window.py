"""Window helpers shared by the polarity and the softmax Swin stages.

Small pure functions on channel-last maps ``(B, H, W, C)``: padding,
partition into (possibly non-square) windows and back, cyclic shift, Swin's
region mask for shifted windows and a key-validity mask for padded tokens.
Window and shift sizes are ``(height, width)`` tuples of Python ints, so
every function is friendly to ``torch.compile`` (no data-dependent branches).
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

Size2 = Tuple[int, int]
# (top, bottom, left, right)
Pad4 = Tuple[int, int, int, int]

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
    win = []
    sft = []
    for size, w, s in zip(hw, window, shift):
        if size <= w:
            win.append(size)
            sft.append(0)
        else:
            win.append(w)
            sft.append(s)
    return (win[0], win[1]), (sft[0], sft[1])


def grid_padding(hw: Size2, window: Size2, offset: Size2 = (0, 0)) -> Pad4:
    """Padding that puts a map on a grid of windows.

    ``offset`` tokens are padded before the map (top/left); the end
    (bottom/right) is padded so that the padded size is a multiple of the
    window.

    Args:
        hw: ``(H, W)`` of the map.
        window: ``(wh, ww)``.
        offset: ``(top, left)`` padding, each in ``[0, window)``.

    Returns:
        ``(top, bottom, left, right)``.
    """
    pads = []
    for size, w, before in zip(hw, window, offset):
        total = -(-(size + before) // w) * w
        pads.append((before, total - size - before))
    return pads[0][0], pads[0][1], pads[1][0], pads[1][1]


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


def _runs(start: int, stop: int, win: int):
    """Runs of positions ``[start, stop)`` of a windowed axis that map to
    rectangular window pieces: a partial first window, whole windows, a
    partial last window (at most three).

    Position ``i`` sits in window ``i // win`` at offset ``i % win``.

    Returns:
        tuples ``(first position, window slice, offset slice)``.
    """
    runs = []
    pos = start
    while pos < stop:
        blk, inner = divmod(pos, win)
        if inner == 0 and stop - pos >= win:
            nb = (stop - pos) // win
            runs.append((pos, slice(blk, blk + nb), slice(0, win)))
            pos += nb * win
        else:
            end_inner = min(win, inner + stop - pos)
            runs.append((pos, slice(blk, blk + 1), slice(inner, end_inner)))
            pos += end_inner - inner
    return runs


def _segments(size: int, win: int, before: int):
    """The runs of the real tokens of an axis padded by ``before``: tuples
    ``(input slice, window slice, offset slice)``."""
    return [(slice(pos - before, pos - before +
                   (wb.stop - wb.start) * (wi.stop - wi.start)), wb, wi)
            for pos, wb, wi in _runs(before, before + size, win)]


def _real_pieces(hw: Size2, pad: Pad4, window: Size2):
    """Rectangles of the real tokens of a padded, windowed map: yields
    ``(rows, cols, index)``, slices of the ``(B, H, W, C)`` map and the
    matching ``(window row, offset, window col, offset)`` slices of the
    ``(B, nWh, wh, nWw, ww, C)`` grid view, and the piece's shape there."""
    for ys, yb, yi in _segments(hw[0], window[0], pad[0]):
        for xs, xb, xi in _segments(hw[1], window[1], pad[2]):
            index = (yb, yi, xb, xi)
            yield ys, xs, index, tuple(t.stop - t.start for t in index)


def window_groups(hw: Size2, pad: Pad4, window: Size2, max_windows: int,
                  split_borders: bool = False):
    """Split a padded window grid into groups of whole windows.

    Groups are runs of at most ``max_windows`` windows of one window row,
    row by row, each row split into runs of equal length (but the last).
    Each group is a rectangle of the unpadded map plus its own share of the
    padding, so that ``pad_partition`` of the rectangle with that padding
    gives exactly the group's windows of the whole map.

    Args:
        hw: ``(H, W)`` before padding.
        pad: ``(top, bottom, left, right)`` of the whole map (each side less
            than a window, as :func:`grid_padding` gives).
        window: ``(wh, ww)``.
        max_windows: windows per group (at least 1).
        split_borders: make the first and the last window of each row a
            group of its own where they hold left / right padding.

    Yields:
        ``(rows, cols, group_pad)``: slices of the ``(B, H, W, C)`` map and
        the group's ``(top, bottom, left, right)``.
    """
    H, W = hw
    wh, ww = window
    top, bottom, left, right = pad
    n_cols = (W + left + right) // ww
    cuts = [0, n_cols]
    if split_borders and n_cols > 1:
        cuts = sorted(set([0, n_cols] + ([1] if left else []) +
                          ([n_cols - 1] if right else [])))
    spans = []  # runs of window columns
    for a, b in zip(cuts, cuts[1:]):
        # split into equal runs (6 windows at most 5 a run: 3 + 3)
        runs = -(-(b - a) // max(1, int(max_windows)))
        per = -(-(b - a) // runs)
        spans += [(c, min(c + per, b)) for c in range(a, b, per)]
    for r in range((H + top + bottom) // wh):
        y0, y1 = r * wh - top, (r + 1) * wh - top
        rows = slice(max(y0, 0), min(y1, H))
        for c0, c1 in spans:
            x0, x1 = c0 * ww - left, c1 * ww - left
            cols = slice(max(x0, 0), min(x1, W))
            yield rows, cols, (rows.start - y0, y1 - rows.stop,
                               cols.start - x0, x1 - cols.stop)


def _scatter_windows(x: Tensor, pad: Pad4, window: Size2,
                     value: float) -> Tensor:
    B, H, W, C = x.shape
    wh, ww = window
    Hp, Wp = H + pad[0] + pad[1], W + pad[2] + pad[3]
    out = x.new_empty((B, Hp // wh, Wp // ww, wh, ww, C))
    grid = out.permute(0, 1, 3, 2, 4, 5)  # (B, nWh, wh, nWw, ww, C)
    # fill only the padding: the rows above and below the map, and the
    # columns left and right of it
    for start, stop in ((0, pad[0]), (pad[0] + H, Hp)):
        for _, yb, yi in _runs(start, stop, wh):
            grid[:, yb, yi].fill_(value)
    rows = _runs(pad[0], pad[0] + H, wh)
    for start, stop in ((0, pad[2]), (pad[2] + W, Wp)):
        for _, xb, xi in _runs(start, stop, ww):
            for _, yb, yi in rows:
                grid[:, yb, yi, xb, xi].fill_(value)
    for ys, xs, (yb, yi, xb, xi), shape in _real_pieces((H, W), pad, window):
        grid[:, yb, yi, xb, xi].copy_(x[:, ys, xs].reshape(B, *shape, C))
    return out.view(-1, wh * ww, C)


def _gather_windows(windows: Tensor, pad: Pad4, window: Size2,
                    hw: Size2) -> Tensor:
    H, W = hw
    wh, ww = window
    Hp, Wp = H + pad[0] + pad[1], W + pad[2] + pad[3]
    C = windows.shape[-1]
    grid = windows.reshape(-1, Hp // wh, Wp // ww, wh, ww, C).permute(
        0, 1, 3, 2, 4, 5)
    B = grid.shape[0]
    out = windows.new_empty(B, H, W, C)
    for ys, xs, (yb, yi, xb, xi), shape in _real_pieces(hw, pad, window):
        out[:, ys, xs].view(B, *shape, C).copy_(grid[:, yb, yi, xb, xi])
    return out


class _PadPartition(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, pad, window, value):
        ctx.geometry = (pad, window, (x.shape[1], x.shape[2]))
        return _scatter_windows(x, pad, window, value)

    @staticmethod
    def backward(ctx, grad):
        pad, window, hw = ctx.geometry
        return _gather_windows(grad, pad, window, hw), None, None, None


class _MergeCrop(torch.autograd.Function):

    @staticmethod
    def forward(ctx, windows, pad, window, hw):
        ctx.geometry = (pad, window)
        return _gather_windows(windows, pad, window, hw)

    @staticmethod
    def backward(ctx, grad):
        pad, window = ctx.geometry
        return _scatter_windows(grad, pad, window, 0.0), None, None, None


def pad_partition(x: Tensor, pad: Pad4, window: Size2,
                  value: float = 0.0) -> Tensor:
    """:func:`pad_map` then :func:`window_partition` in one copy.

    Args:
        x: ``(B, H, W, C)`` (any strides).
        pad: ``(top, bottom, left, right)``; the padded size must be a
            multiple of the window.
        window: ``(wh, ww)``.
        value: what padded tokens hold.

    Returns:
        ``(B * nW, wh * ww, C)`` like :func:`window_partition`.
    """
    if not any(pad):
        return window_partition(x, window)
    return _PadPartition.apply(x, tuple(pad), tuple(window), float(value))


def merge_crop(windows: Tensor, pad: Pad4, window: Size2,
               hw: Size2) -> Tensor:
    """:func:`window_reverse` then :func:`crop_map` in one copy.

    Args:
        windows: ``(B * nW, wh * ww, C)`` of the padded map.
        pad: the padding :func:`pad_partition` used.
        window: ``(wh, ww)``.
        hw: ``(H, W)`` before padding.

    Returns:
        ``(B, H, W, C)``, contiguous when anything was padded.
    """
    if not any(pad):
        return window_reverse(windows, window, hw)
    return _MergeCrop.apply(windows, tuple(pad), tuple(window), tuple(hw))


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
    for hs in _region_slices(window[0], shift[0]):
        for ws in _region_slices(window[1], shift[1]):
            labels[:, hs, ws, :] = cnt
            cnt += 1
    lw = window_partition(labels, window).squeeze(-1)  # (nW, N)
    diff = lw.unsqueeze(1) - lw.unsqueeze(2)
    return torch.zeros_like(diff).masked_fill(diff != 0, mask_value)


def _region_slices(w: int, s: int) -> Tuple[slice, ...]:
    if s == 0:
        return (slice(0, None), )
    return (slice(0, -w), slice(-w, -s), slice(-s, None))


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
