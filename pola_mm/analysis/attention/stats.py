"""Statistics of the attention rows: entropy (and PolaFormer's
positive-sequence entropy), numerical rank with and without the depth-wise
conv, per head and block, and their summary table."""
import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from .capture import BlockCapture
from .maps import attention_rows, dwc_rows, polarity_qk, polarity_scores

__all__ = [
    'row_entropy', 'positive_sequence_entropy', 'numerical_rank',
    'sample_rows', 'block_statistics', 'summarise_statistics',
    'format_statistics'
]


def row_entropy(rows: Tensor) -> Tensor:
    """Shannon entropy (nats) of rows that sum to 1: ``-sum a log a`` over
    the last dim (``0 log 0 = 0``)."""
    return -(rows * torch.log(torch.where(rows > 0, rows,
                                          torch.ones_like(rows)))).sum(-1)


def positive_sequence_entropy(x: Union[Tensor, Sequence[float]]) -> Tensor:
    """PolaFormer's positive-sequence entropy (PSE, its Eq. 7), in nats.

    For a non-negative sequence ``x`` with a positive sum ``S``:
    ``PSE(x) = -sum_i (x_i / S) log(x_i / S)``, the entropy of the
    sequence normalised by its sum, over the last dim.

    Raises:
        ValueError: ``x`` has a negative entry or a row of zeros.
    """
    x = torch.as_tensor(x, dtype=torch.float64)
    if (x < 0).any():
        raise ValueError('PSE is defined for non-negative sequences; got a '
                         'negative entry (apply the feature map first)')
    total = x.sum(-1, keepdim=True)
    if (total <= 0).any():
        raise ValueError('PSE needs a positive sum; got a sequence of zeros')
    return row_entropy(x / total)


def numerical_rank(mat: Tensor, rtol: Optional[float] = None) -> int:
    """Numerical rank of a matrix (its singular values above ``rtol *
    max``; torch's default ``rtol``, ``max(m, n) * eps``, when None)."""
    return int(torch.linalg.matrix_rank(mat.double(), rtol=rtol))


def sample_rows(num_tokens: int, num_rows: int, seed: int = 0) -> Tensor:
    """``min(num_rows, N)`` distinct token indices, sorted, reproducible."""
    g = torch.Generator().manual_seed(seed)
    r = min(num_rows, num_tokens)
    return torch.randperm(num_tokens, generator=g)[:r].sort().values


@torch.no_grad()
def block_statistics(cap: BlockCapture, num_rows: int = 128, seed: int = 0,
                     rank_channels: int = 4,
                     rtol: Optional[float] = None) -> List[dict]:
    """Per-head entropy and rank of one block on a sample of query rows.

    For each head, on ``min(num_rows, N)`` sampled queries of the first
    image:

    - ``entropy``: mean row entropy (nats) of each map (polarity:
      ``same``, ``opposite``, ``combined``, ``relu``; softmax:
      ``softmax``); ``max_entropy = log N``;
    - ``pse``: mean PSE of the unnormalised score rows (polarity only; PSE
      of a row equals the entropy of its normalised row, so it matches
      ``entropy`` of that flow up to the module's 1e-6);
    - ``rank``: numerical rank of the ``R x N`` sampled rows of each map
      (at most ``min(R, 2d)`` for a polarity flow, ``min(R, d)`` for ReLU
      linear attention);
    - ``rank_dwc`` (polarity only): the mean over the first
      ``rank_channels`` channels ``c`` of each flow's half of the rank of
      ``A + D_c`` (flow plus depth-wise conv, :func:`dwc_rows`).

    Returns:
        one dict per head: ``stage, block, head, kind, tokens, rows,
        head_dims, max_entropy, entropy{...}, pse{...}, rank{...},
        rank_dwc{...}, power_mean`` (the head's mean exponent ``p``;
        absent for ``feature_map='pacs'``, which has no power).
    """
    if num_rows < 1 or rank_channels < 1:
        raise ValueError(f'num_rows ({num_rows}) and rank_channels '
                         f'({rank_channels}) must be at least 1')
    N = cap.hw[0] * cap.hw[1]
    rows = sample_rows(N, num_rows, seed)
    maps = attention_rows(cap, rows)
    d = cap.x.shape[-1] // cap.num_heads
    res = []
    extra: Dict[str, Tensor] = {}
    p_mean = None
    if cap.kind == 'polarity':
        qk = polarity_qk(cap.attn, cap.x, cap.hw)
        extra = polarity_scores(qk, rows)
        p_mean = None if qk.p is None else qk.p.mean(dim=(0, 2, 3))
        picked = {name: list(chans)[:rank_channels] for name, chans in (
            ('same', range(0, d // 2)), ('opposite', range(d // 2, d)))}
        dwc = {c: dwc_rows(cap.attn, cap.hw, rows, c)
               for chans in picked.values() for c in chans}
    for head in range(cap.num_heads):
        item = dict(stage=cap.stage, block=cap.block, head=head,
                    kind=cap.kind, tokens=N, rows=len(rows), head_dims=d,
                    max_entropy=math.log(N), entropy={}, pse={}, rank={},
                    rank_dwc={})
        for name, m in maps.items():
            a = m[0, head]
            item['entropy'][name] = float(row_entropy(a).mean())
            item['rank'][name] = numerical_rank(a, rtol)
        for name, s in extra.items():
            item['pse'][name] = float(
                positive_sequence_entropy(s[0, head]).mean())
        if cap.kind == 'polarity':
            if p_mean is not None:
                item['power_mean'] = float(p_mean[head])
            for name, chans in picked.items():
                item['rank_dwc'][name] = float(np.mean([
                    numerical_rank(maps[name][0, head] + dwc[c], rtol)
                    for c in chans]))
        res.append(item)
    return res


def summarise_statistics(per_head: Sequence[dict]) -> List[dict]:
    """Mean over heads (and images) of :func:`block_statistics` records, one
    dict per ``(stage, block)`` in order, with the same keys (``head``
    dropped, ``heads`` and ``images`` counted)."""
    groups: Dict[Tuple[int, int], List[dict]] = {}
    for r in per_head:
        groups.setdefault((r['stage'], r['block']), []).append(r)
    out = []
    for (s, b), rs in sorted(groups.items()):
        first = rs[0]
        item = dict(stage=s, block=b, kind=first['kind'],
                    tokens=first['tokens'], rows=first['rows'],
                    head_dims=first['head_dims'],
                    max_entropy=first['max_entropy'],
                    heads=len({r['head'] for r in rs}),
                    images=len(rs) // len({r['head'] for r in rs}))
        for key in ('entropy', 'pse', 'rank', 'rank_dwc'):
            item[key] = {k: float(np.mean([r[key][k] for r in rs]))
                         for k in first[key]}
        if 'power_mean' in first:
            item['power_mean'] = float(np.mean([r['power_mean'] for r in rs]))
        out.append(item)
    return out


def format_statistics(summary: Sequence[dict]) -> str:
    """A Markdown table of :func:`summarise_statistics`."""
    head = ('| stage.block | kind | tokens | entropy same / opp / combined '
            '(nats) | entropy ReLU or softmax | log N | rank same / ReLU '
            '(rows) | rank + dwc | mean p |')
    lines = [head, '|' + '---|' * 9]
    for r in summary:
        e, k = r['entropy'], r['rank']
        if r['kind'] == 'polarity':
            ent = f"{e['same']:.2f} / {e['opposite']:.2f} / " \
                  f"{e['combined']:.2f}"
            other = f"{e['relu']:.2f}"
            rank = f"{k['same']:.0f} / {k['relu']:.0f} ({r['rows']})"
            dwc = f"{r['rank_dwc']['same']:.0f}"
            p = f"{r['power_mean']:.2f}" if 'power_mean' in r else 'PaCS'
        else:
            ent, other = '-', f"{e['softmax']:.2f}"
            rank = f"{k['softmax']:.0f} ({r['rows']})"
            dwc, p = '-', '-'
        lines.append(f"| {r['stage']}.{r['block']} | {r['kind']} | "
                     f"{r['tokens']} | {ent} | {other} | "
                     f"{r['max_entropy']:.2f} | {rank} | {dwc} | {p} |")
    return '\n'.join(lines)
