"""Figures: one query's attention rows overlaid on the image, and the
statistics of every block (what ``tools/analysis/attention_maps.py`` and
``attention_stats.py`` write)."""
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ...type_aliases import Size2
from .capture import BlockCapture
from .maps import attention_rows, query_tokens

__all__ = ['upsample_row', 'plot_attention_map', 'plot_statistics']


def _pyplot():
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError(
            'plotting needs matplotlib: pip install matplotlib') from e
    return plt


def upsample_row(row: Tensor, map_hw: Size2, image_hw: Size2) -> np.ndarray:
    """One attention row ``(N,)`` on the stage map, bilinearly upsampled to
    the image: ``(H, W)`` float array (sums to about ``N`` times less)."""
    m = row.float().view(1, 1, map_hw[0], map_hw[1])
    return F.interpolate(m, size=tuple(image_hw), mode='bilinear',
                         align_corners=False)[0, 0].numpy()


def plot_attention_map(image: np.ndarray, cap: BlockCapture,
                       point: Tuple[float, float], path: str,
                       model_name: str, random_init: bool,
                       head: Optional[int] = None) -> Dict[str, np.ndarray]:
    """Write a PNG of one query's attention rows overlaid on the image.

    One panel per map (polarity: same-signed, opposite-signed, combined,
    ReLU linear attention with the same q, k; softmax: the softmax row),
    each with its colour bar; the query is marked with a star. The title
    names model, stage, block, head (or "mean of h heads"), query and
    "random init" when no checkpoint was loaded.

    Args:
        image: ``(H, W, 3)`` uint8, the image the backbone's input was
            resized from (the stage map covers it).
        cap: the block's capture (from the same image).
        point: ``(x, y)`` pixel of the query on ``image``.
        path: PNG to write.
        model_name: shown in the title (e.g. the config name).
        random_init: whether the weights are random.
        head: a head index, or None for the mean over heads.

    Returns:
        ``{map name: (H', W') weights on the stage map}`` that were drawn.
    """
    plt = _pyplot()
    if head is not None and not 0 <= head < cap.num_heads:
        raise ValueError(f'head {head} does not exist: stage {cap.stage} '
                         f'has {cap.num_heads} heads (0..'
                         f'{cap.num_heads - 1})')
    rows = query_tokens([point], image.shape[:2], cap.hw)
    maps = attention_rows(cap, rows)
    drawn = {}
    for name, m in maps.items():
        r = m[0, :, 0] if head is None else m[0, head:head + 1, 0]
        drawn[name] = r.mean(0).view(*cap.hw).numpy()
    labels = dict(same='same-signed flow', opposite='opposite-signed flow',
                  combined='combined (|g|-weighted)',
                  relu='ReLU linear attention (p=1, same q, k)',
                  softmax='softmax (window)')
    n = len(drawn)
    fig, axes = plt.subplots(1, n, figsize=(max(4.2 * n, 6.5), 4.6),
                             squeeze=False)
    for ax, (name, w) in zip(axes[0], drawn.items()):
        up = upsample_row(torch.from_numpy(w).flatten(), cap.hw,
                          image.shape[:2])
        ax.imshow(image)
        im = ax.imshow(up, cmap='jet', alpha=0.55, vmin=0,
                       vmax=float(up.max()) or 1.0)
        ax.plot([point[0]], [point[1]], marker='*', color='white',
                markersize=14, markeredgecolor='black')
        ax.set_title(labels[name], fontsize=9)
        ax.axis('off')
        cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
        cb.ax.tick_params(labelsize=7)
    who = ('mean of %d heads' % cap.num_heads if head is None else
           f'head {head}')
    init = ' - random init' if random_init else ''
    fig.suptitle(f'{model_name}: stage {cap.stage} block {cap.block} '
                 f'({cap.kind}, {cap.hw[0]}x{cap.hw[1]} tokens)\n{who}, '
                 f'query (x={point[0]:g}, y={point[1]:g}){init}',
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return drawn


def plot_statistics(summary: Sequence[dict], path: str,
                    title: str = '') -> None:
    """Write a PNG: entropy / log N and rank per block, every map.

    Args:
        summary: from :func:`summarise_statistics`.
        path: PNG to write.
        title: figure title.
    """
    plt = _pyplot()
    labels = [f"{r['stage']}.{r['block']}" for r in summary]
    xs = np.arange(len(summary))
    fig, (ax_e, ax_r) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = ['same', 'opposite', 'combined', 'relu', 'softmax']
    for name in names:
        ys = [r['entropy'][name] / r['max_entropy']
              if name in r['entropy'] else np.nan for r in summary]
        rk = [r['rank'][name] / r['rows']
              if name in r['rank'] else np.nan for r in summary]
        if not all(np.isnan(ys)):
            ax_e.plot(xs, ys, '-o', label=name)
            ax_r.plot(xs, rk, '-o', label=name)
    dw = [r['rank_dwc']['same'] / r['rows'] if r['rank_dwc'] else np.nan
          for r in summary]
    if not all(np.isnan(dw)):
        ax_r.plot(xs, dw, '--^', label='same + dwc')
    ax_e.set_ylabel('mean row entropy / log N')
    ax_r.set_ylabel('numerical rank / sampled rows')
    for ax in (ax_e, ax_r):
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, rotation=90, fontsize=7)
        ax.set_xlabel('stage.block')
        ax.grid(True, alpha=0.3)
        ax.set_ylim(0, 1.05)
    ax_e.legend(fontsize='small')
    ax_r.legend(fontsize='small')
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
