"""CPU run planning: cache-sized runs of tokens for the fast
implementations' CPU inference, apart from their arithmetic.

Elementwise chains over a whole ``(B, h, N, d)`` tensor stream every
intermediate through memory; on runs of tokens small enough to stay in
cache, in dense buffers reused by every run, they run about 2x faster on
the CPU (docs/performance.md). The fast implementations say how large a
run may be (their own budgets, tunable); this module cuts the work into
runs and holds the reused buffers. On GPUs the whole input is one run.
"""
from typing import List, Sequence, Tuple

from torch import Tensor

__all__ = ['plan_runs', 'token_runs', 'token_major', 'RunBuffers']


def plan_runs(x: Tensor, budget: int, min_tokens: int
              ) -> Tuple[List[slice], int]:
    """Runs for ``x`` ``(B, h, N, d)``: slices of ``B`` and a token step.

    One run on GPUs and when all of ``x`` fits in ``budget`` elements.
    Otherwise runs of ``b`` sequences (as many as fit with at least
    ``min(N, min_tokens)`` tokens each), each walked in equal runs of
    tokens that fit.
    """
    B, h, N, d = x.shape
    if x.device.type != 'cpu' or B * h * N * d <= budget:
        return [slice(0, B)], N
    per_token = max(h * d, 1)
    b = max(1, min(B, budget // (per_token * min(N, min_tokens))))
    runs = -(-(b * per_token * N) // budget)
    step = -(-N // runs)
    return [slice(i, min(i + b, B)) for i in range(0, B, b)], step


def token_runs(n: int, step: int) -> List[slice]:
    """Slices of ``step`` tokens (the last one shorter) covering ``n``."""
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def token_major(q: Tensor) -> Tensor:
    """An empty ``(B, h, N, d)`` laid out ``(B, N, h, d)`` in memory, so that
    the caller's ``x.transpose(1, 2).reshape(B, N, h * d)`` is free."""
    B, h, N, d = q.shape
    return q.new_empty(B, N, h, d).transpose(1, 2)


class RunBuffers:
    """Dense buffers reused by every run of a walk over the tokens of ``x``
    ``(B, h, N, d)`` in runs of ``step``: one ``(B, h, step, w)`` buffer
    per width ``w`` in ``widths``, sliced to each run."""

    def __init__(self, x: Tensor, step: int, widths: Sequence[int]) -> None:
        B, h, N, _ = x.shape
        n = min(step, N)
        self.buffers = [x.new_empty(B, h, n, w) for w in widths]

    def take(self, run: Tensor) -> List[Tensor]:
        """The buffers sliced to the run ``run`` ``(b, h, n, d)``."""
        b, n = run.shape[0], run.shape[-2]
        return [t[:b, :, :n] for t in self.buffers]
