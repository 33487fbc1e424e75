"""The sequence-length benchmark: the attention alone against sequence
length.

Polarity attention (the op, :func:`pola_mm.ops.polarity_attention`, plus
the depth-wise conv on v, as a block computes it), torch's
``scaled_dot_product_attention`` and softmax written out, forward and
forward + backward, each length in its own process (see
:mod:`pola_mm.analysis.benchmark.worker`), the lengths of a method run by
the benchmarks' runner with a stop rule
(:func:`~pola_mm.analysis.benchmark.results.measure_in_rounds`); log-log
slopes of time and
memory against the number of tokens tell linear from quadratic.
"""
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .results import measure_in_rounds
from .worker import Size, StepMemory, run_in_worker, timed_steps

#: Attention methods of the sequence-length mode: polarity attention (the
#: op plus the depth-wise conv on v, as a block computes it), torch's
#: ``scaled_dot_product_attention`` (flash / memory-efficient kernels where
#: the device has them) and softmax written out (``softmax(q k^T) v``, the
#: ``N x N`` matrix materialised); and, beside the default three, the op
#: alone (``polarity_op``; ``polarity_op_torch`` without its Triton
#: kernels) and the memory-bandwidth bound of any attention (``bound``: one
#: elementwise pass, ``addcmul(q, k, v)``, that reads q, k and v once and
#: writes one map; its backward reads the gradient and writes three).
SEQ_METHODS: Tuple[str, ...] = ('polarity', 'sdpa', 'naive', 'polarity_op',
                                'polarity_op_torch', 'bound')
#: What the sequence-length mode measures unless told.
DEFAULT_SEQ_METHODS: Tuple[str, ...] = ('polarity', 'sdpa', 'naive')
SEQ_MODES: Tuple[str, ...] = ('fwd', 'fwd+bwd')


@dataclass
class _SeqLenKey:
    """What a :class:`SeqLenResult` measured (its required fields)."""
    method: str
    mode: str
    tokens: int
    grid: Size
    batch: int
    heads: int
    head_dims: int
    device: str


@dataclass
class SeqLenResult(StepMemory, _SeqLenKey):
    """One attention method at one sequence length (see :func:`run_seqlen`).

    The steps, memory and ``error`` (a failure: out of memory, timeout) are
    those of :class:`~pola_mm.analysis.benchmark.worker.StepMemory`;
    ``skipped`` says why a case was not run (a cap would be exceeded).
    """
    skipped: Optional[str] = None

    def summary(self) -> str:
        return f'skipped ({self.skipped})' if self.skipped else \
            super().summary()


def seq_grid(tokens: int) -> Size:
    """The grid ``(H, W)``, ``H * W = tokens``, closest to square with
    ``H <= W`` (the map the depth-wise conv runs on)."""
    h = int(math.isqrt(tokens))
    while tokens % h:
        h -= 1
    return (h, tokens // h)


def naive_bytes(tokens: int, batch: int, heads: int, mode: str) -> int:
    """Bytes of the ``N x N`` float32 matrices naive softmax keeps: the
    logits and the weights (forward), and as many again for their gradients
    (forward + backward)."""
    per = 4 * batch * heads * tokens * tokens
    return per * (2 if mode == 'fwd' else 4)


def measure_seqlen(method: str, mode: str, tokens: int, batch: int = 1,
                   heads: int = 1, head_dims: int = 32,
                   device: str = 'cpu', warmup: int = 1, repeats: int = 3,
                   threads: Optional[int] = None,
                   seed: int = 0) -> Dict[str, Any]:
    """Measure one attention method in the current process.

    Inputs ``q, k, v`` are ``(batch, heads, tokens, head_dims)`` float32
    (random normal); polarity attention also gets a random ``power``,
    ``scale`` and a 5x5 depth-wise conv over the grid :func:`seq_grid`.
    A forward+backward step back-propagates ``out.sum()`` to ``q, k, v``.

    Returns:
        dict with ``times``, ``peak_mem_mb``, ``base_mem_mb``, ``threads``.
    """
    import torch
    import torch.nn.functional as F
    if method not in SEQ_METHODS:
        raise ValueError(f'method must be one of {SEQ_METHODS}, got '
                         f'{method!r}')
    if mode not in SEQ_MODES:
        raise ValueError(f'mode must be one of {SEQ_MODES}, got {mode!r}')
    if threads:
        torch.set_num_threads(int(threads))
    torch.manual_seed(seed)
    dev = torch.device(device)
    train = mode == 'fwd+bwd'
    shape = (batch, heads, tokens, head_dims)
    q, k, v = (torch.randn(shape, device=dev, requires_grad=train)
               for _ in range(3))
    H, W = seq_grid(tokens)
    if method in ('polarity_op', 'polarity_op_torch'):
        from pola_mm.ops import polarity_attention
        power = torch.randn(1, heads, 1, head_dims, device=dev) * 0.5
        scale = torch.randn(1, heads, 1, head_dims, device=dev) * 0.5

        def attend():
            return polarity_attention(q, k, v, scale, power, 4.0)
    elif method == 'bound':
        def attend():
            return torch.addcmul(q, k, v)
    elif method == 'polarity':
        from pola_mm.ops import depthwise_conv2d, polarity_attention
        power = torch.randn(1, heads, 1, head_dims, device=dev) * 0.5
        scale = torch.randn(1, heads, 1, head_dims, device=dev) * 0.5
        C = heads * head_dims
        weight = torch.randn(C, 1, 5, 5, device=dev) * 0.1
        bias = torch.zeros(C, device=dev)

        def attend():
            x = polarity_attention(q, k, v, scale, power, 4.0)
            vmap = v.transpose(1, 2).reshape(batch, H, W, C)
            conv = depthwise_conv2d(vmap.permute(0, 3, 1, 2), weight, bias,
                                    (2, 2))
            return x.transpose(1, 2).reshape(batch, tokens, C) + \
                conv.permute(0, 2, 3, 1).reshape(batch, tokens, C)
    elif method == 'sdpa':
        def attend():
            return F.scaled_dot_product_attention(q, k, v)
    else:
        def attend():
            a = (q * head_dims ** -0.5) @ k.transpose(-2, -1)
            return a.softmax(-1) @ v

    def step() -> None:
        if train:
            attend().sum().backward()
            for t in (q, k, v):
                t.grad = None
        else:
            with torch.no_grad():
                attend()

    import contextlib

    from pola_mm.ops import use_implementation
    paths = (use_implementation('cpu') if method == 'polarity_op_torch'
             else contextlib.nullcontext())
    with paths:
        times, base, peak = timed_steps(step, dev, warmup, repeats)
    return dict(times=times, peak_mem_mb=peak, base_mem_mb=base,
                threads=torch.get_num_threads())


def run_seqlen(tokens: Sequence[int],
               methods: Sequence[str] = DEFAULT_SEQ_METHODS,
               modes: Sequence[str] = SEQ_MODES,
               batch: int = 1,
               heads: int = 1,
               head_dims: int = 32,
               device: str = 'cpu',
               warmup: int = 1,
               repeats: int = 3,
               threads: Optional[int] = None,
               mem_cap_mb: float = 8192,
               time_cap_s: float = 60,
               log: Optional[Callable[[str], None]] = None
               ) -> List[SeqLenResult]:
    """Time and peak memory of each attention method against sequence
    length, each measurement in its own process.

    Lengths are run in increasing order. A method stops (the remaining
    lengths are reported as skipped, with the reason) once a step took more
    than ``time_cap_s`` or failed (out of memory, the worker killed after
    ``2 * time_cap_s * (warmup + repeats) + 60`` s). Naive softmax is not
    started where its ``N x N`` matrices alone (:func:`naive_bytes`) would
    exceed ``mem_cap_mb``.

    Returns:
        list[SeqLenResult], one per (mode, method, length) in that order.
    """
    bad = [m for m in methods if m not in SEQ_METHODS]
    bad += [m for m in modes if m not in SEQ_MODES]
    if bad:
        raise ValueError(f'unknown methods/modes {bad}; methods '
                         f'{SEQ_METHODS}, modes {SEQ_MODES}')
    timeout = 2 * time_cap_s * (warmup + repeats) + 60

    def sweep(mode: str, method: str) -> List[SeqLenResult]:
        """The lengths of one method in one mode, through the runner."""
        lengths = {f'{method} N={n}': int(n) for n in sorted(tokens)}

        def new(label: str, skipped: Optional[str] = None) -> SeqLenResult:
            n = lengths[label]
            return SeqLenResult(method, mode, n, seq_grid(n), batch, heads,
                                head_dims, device, skipped=skipped)

        def measure(label: str) -> SeqLenResult:
            need = naive_bytes(lengths[label], batch, heads, mode) / 2**20
            if method == 'naive' and need > mem_cap_mb:
                return new(label, f'N x N matrices need {need / 1024:.1f} '
                           f'GiB > cap {mem_cap_mb / 1024:.1f} GiB')
            r = new(label)
            out = run_in_worker(
                'pola_mm.analysis.benchmark.seqlen:measure_seqlen',
                dict(method=method, mode=mode, tokens=r.tokens, batch=batch,
                     heads=heads, head_dims=head_dims, device=device,
                     warmup=warmup, repeats=repeats, threads=threads),
                timeout)
            if 'error' in out:
                r.error = out['error']
            else:
                r.record(out)
            return r

        def stop(r: SeqLenResult) -> Optional[str]:
            if r.error:
                return f'stopped after {r.tokens} tokens failed'
            if r.time_median is not None and r.time_median > time_cap_s:
                return (f'stopped: {r.tokens} tokens took '
                        f'{r.time_median:.1f} s > cap {time_cap_s:g} s')
            return None

        return measure_in_rounds(list(lengths), measure, 1, log,
                                 f'seqlen {mode}', stop, new)

    return [r for mode in modes for method in methods
            for r in sweep(mode, method)]


def fit_slopes(results: Sequence[SeqLenResult]
               ) -> Dict[Tuple[str, str], Dict[str, Optional[float]]]:
    """Slopes of log(time) and log(memory added) against log(tokens), by
    least squares, per (method, mode) over its measured lengths (1: linear,
    2: quadratic). None with fewer than two lengths.

    The fit uses the lengths of at least 1/16 of the largest measured one
    when three or more remain (the smallest lengths are dominated by fixed
    costs).
    """
    groups: Dict[Tuple[str, str], List[SeqLenResult]] = {}
    for r in results:
        if r.time_median is not None:
            groups.setdefault((r.method, r.mode), []).append(r)
    out = {}
    for key, rs in groups.items():
        rs = sorted(rs, key=lambda r: r.tokens)
        big = [r for r in rs if r.tokens * 16 >= rs[-1].tokens]
        if len(big) >= 3:
            rs = big
        out[key] = dict(time=_slope([(r.tokens, r.time_median) for r in rs]),
                        mem=_slope([(r.tokens, r.extra_mem_mb) for r in rs]),
                        lengths=[r.tokens for r in rs])
    return out


def _slope(points: Sequence[Tuple[float, Optional[float]]]
           ) -> Optional[float]:
    pts = [(math.log(x), math.log(y)) for x, y in points
           if y is not None and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    if sxx == 0:
        return None
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def format_seqlen_table(results: Sequence[SeqLenResult]) -> str:
    """A Markdown table (one row per length and mode, one column pair per
    method: time in ms and memory added in MiB) and the fitted slopes."""
    methods = [m for m in SEQ_METHODS if any(r.method == m for r in results)]
    cells: Dict[Tuple[str, int], Dict[str, str]] = {}
    for r in results:
        if r.skipped:
            txt = 'skipped | -'
        elif r.error:
            txt = f'failed ({r.error[:40]}) | -'
        else:
            txt = f'{r.time_median * 1e3:.1f} | {r.extra_mem_mb:.0f}'
        cells.setdefault((r.mode, r.tokens), {})[r.method] = txt
    head = '| mode | tokens | ' + ' | '.join(
        f'{m} ms | {m} MiB' for m in methods) + ' |'
    lines = [head, '|' + '---|' * (2 + 2 * len(methods))]
    for (mode, n), row in sorted(cells.items(),
                                 key=lambda kv: (kv[0][0], kv[0][1])):
        lines.append(f'| {mode} | {n} | ' + ' | '.join(
            row.get(m, '- | -') for m in methods) + ' |')
    slopes = fit_slopes(results)
    if slopes:
        lines.append('')
        lines.append('Fitted log-log slopes (1 = linear, 2 = quadratic):')
        for (method, mode), s in sorted(slopes.items()):
            t = '-' if s['time'] is None else f"{s['time']:.2f}"
            m = '-' if s['mem'] is None else f"{s['mem']:.2f}"
            lines.append(f'- {method} {mode}: time {t}, memory added {m} '
                         f"(lengths {s['lengths'][0]}-{s['lengths'][-1]})")
    notes = sorted({f'{r.method} {r.mode}: {r.skipped}' for r in results
                    if r.skipped and not r.skipped.startswith('stopped')})
    stops = sorted({f'{r.method} {r.mode}: {r.skipped}' for r in results
                    if r.skipped and r.skipped.startswith('stopped')})
    if notes or stops:
        lines.append('')
        lines.extend('- ' + n for n in stops + notes)
    return '\n'.join(lines)


def plot_seqlen(results: Sequence[SeqLenResult], path: str) -> None:
    """Write a log-log PNG of time and memory added against tokens."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError(
            'plotting needs matplotlib: pip install matplotlib') from e
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for method in SEQ_METHODS:
        for mode in SEQ_MODES:
            rs = sorted((r for r in results if r.method == method
                         and r.mode == mode and r.time_median is not None),
                        key=lambda r: r.tokens)
            if not rs:
                continue
            style = ('-' if mode == 'fwd' else '--') + \
                {'polarity': 'o', 'sdpa': 's', 'naive': '^',
                 'polarity_op': 'D', 'polarity_op_torch': 'd',
                 'bound': 'x'}[method]
            xs = [r.tokens for r in rs]
            ax_t.plot(xs, [r.time_median for r in rs], style,
                      label=f'{method} {mode}')
            ax_m.plot(xs, [max(r.extra_mem_mb, 1e-3) for r in rs], style,
                      label=f'{method} {mode}')
    for ax, ylabel in ((ax_t, 'time per step (s)'),
                       (ax_m, 'memory added by the step (MiB)')):
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('sequence length (tokens)')
        ax.set_ylabel(ylabel)
        ax.grid(True, which='both', alpha=0.3)
    ax_t.legend(fontsize='small')
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
