"""Benchmark results compared and printed: Pola / softmax ratios against
each family's baseline (:data:`BASELINES`), growth with the input size,
the Markdown table (with the notes of the whole-model and ONNX Runtime
profile modes) and the plot."""
from typing import Dict, List, Optional, Sequence, Tuple

from .ortprofile import profile_lines
from .results import BenchmarkResult, size_str
from .whole import whole_notes

__all__ = ['BASELINES', 'baseline_of', 'compute_ratios', 'compute_growth',
           'format_ratio', 'format_table', 'plot_results']

#: The model each family is compared with (by name prefix, first match):
#: the softmax models for Pola-Swin/PVT; PolaPP-b2's kernel for its plain
#: formula, Pola-Swin-T for PolaPP.
BASELINES: Dict[str, str] = {
    'pola_swin': 'swin_t', 'pola_pvt': 'pvt_t',
    'polapp_b2_plain': 'polapp_b2', 'polapp': 'pola_swin_t'}


def baseline_of(name: str) -> Optional[str]:
    """The name of the softmax model that ``name`` is compared with."""
    for prefix, base in BASELINES.items():
        if name.startswith(prefix):
            return base
    return None


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _group_key(r: BenchmarkResult) -> Tuple:
    return (r.title, r.mode, tuple(r.size), r.batch, r.device, r.dtype,
            r.runtime)


def compute_ratios(
        results: Sequence[BenchmarkResult]
) -> Dict[int, Tuple[Optional[float], Optional[float]]]:
    """Pola / softmax (time, peak memory) ratios, keyed by result index.

    A result is compared with its ``baseline`` if it names one, else with
    its family's baseline (:data:`BASELINES`), measured under the same
    conditions (runtime included) in the same case.
    """
    by_key = {(_group_key(r), r.name): r for r in results}
    ratios = {}
    for i, r in enumerate(results):
        base_name = r.baseline or baseline_of(r.name)
        base = by_key.get((_group_key(r), base_name))
        if base is None or base is r:
            continue
        ratios[i] = (_ratio(r.time_median, base.time_median),
                     _ratio(r.peak_mem_mb, base.peak_mem_mb))
    return ratios


def compute_growth(results: Sequence[BenchmarkResult]) -> List[str]:
    """Lines describing how each model's cost grows with the input size.

    For every model measured in the same mode, batch, device and dtype at
    several sizes: the time and peak-memory ratio from the smallest size to
    each larger one, next to the ratio of pixels (linear cost grows as
    pixels).
    """
    groups: Dict[Tuple, List[BenchmarkResult]] = {}
    for r in results:
        if r.error is None:
            groups.setdefault((r.name, r.mode, r.batch, r.device, r.dtype,
                               r.runtime), []).append(r)
    lines = []
    for (name, mode, batch, device, dtype, runtime), rs in groups.items():
        sizes = {tuple(r.size): r for r in rs}
        if len(sizes) < 2:
            continue
        ordered = sorted(sizes.values(), key=lambda r: r.size[0] * r.size[1])
        small = ordered[0]
        small_extra = small.extra_mem_mb
        for big in ordered[1:]:
            px = big.size[0] * big.size[1] / (small.size[0] * small.size[1])
            lines.append(
                f'{name} {mode} b{batch} {device} {dtype}'
                + ('' if runtime == 'pytorch' else f' {runtime}') + ': '
                f'{size_str(small.size)} -> {size_str(big.size)} '
                f'(pixels x{px:.1f}): time x'
                f'{big.time_median / small.time_median:.2f}, peak memory x'
                f'{big.peak_mem_mb / small.peak_mem_mb:.2f}, memory added '
                f'by the step x'
                f'{format_ratio(_ratio(big.extra_mem_mb, small_extra))}')
    return lines


def format_ratio(x: Optional[float]) -> str:
    """A ratio with two decimals, ``-`` for None."""
    return '-' if x is None else f'{x:.2f}'


def format_table(results: Sequence[BenchmarkResult]) -> str:
    """A Markdown table of the results with Pola / softmax ratios.

    Columns: case, model, mode, size, batch, median time (s), min time,
    peak memory (MiB), memory added by the step (MiB), time and memory
    ratio over the family's softmax baseline in the same case (and
    runtime); with ONNX Runtime or OpenVINO results also the runtime in the
    mode column and the difference ONNX Runtime vs PyTorch of the exported
    file relative to the output scale. Followed by the growth lines of
    :func:`compute_growth` and notes on the export, how memory and time of
    exported files were measured, and ONNX Runtime's profile.
    """
    ratios = compute_ratios(results)
    ort = any(r.runtime != 'pytorch' for r in results)
    cols = ['case', 'model', 'mode', 'size', 'batch', 'time (s)', 'min (s)',
            'peak mem (MiB)', 'step mem (MiB)', 'time ratio', 'mem ratio']
    if ort:
        cols.append('ORT vs PyTorch')
    lines = ['| ' + ' | '.join(cols) + ' |', '|' + '---|' * len(cols)]
    for i, r in enumerate(results):
        mode = r.mode if r.runtime == 'pytorch' else f'{r.mode} {r.runtime}'
        diff = [] if not ort else [
            r.check if r.check else
            '-' if r.onnx_rel_diff is None else f'{r.onnx_rel_diff:.1e}']
        if r.error:
            cells = [r.title, r.name, mode, size_str(r.size), str(r.batch),
                     f'failed: {r.error}'] + [''] * (len(cols) - 6)
            if ort:
                cells[-1] = diff[0]
        else:
            tr, mr = ratios.get(i, (None, None))
            cells = [r.title, r.name, mode, size_str(r.size), str(r.batch),
                     f'{r.time_median:.3f}', f'{r.time_min:.3f}',
                     f'{r.peak_mem_mb:.0f}', f'{r.extra_mem_mb:.0f}',
                     format_ratio(tr), format_ratio(mr)] + diff
        lines.append('| ' + ' | '.join(cells) + ' |')
    growth = compute_growth(results)
    if growth:
        lines.append('')
        lines.append('Growth with input size:')
        lines.extend('- ' + g for g in growth)
    exported = [r for r in results if r.export_s is not None
                and r.exporter != 'mmdeploy']
    if exported:
        how = sorted({f'{r.exporter} exporter, opset {r.opset}'
                      for r in exported})
        lines.append('')
        lines.append(
            _runtimes(exported) + ' (CPU), ' + '; '.join(how)
            + '; export time (s): ' + ', '.join(
                f'{n} {t:.1f}' for n, t in
                {r.name: r.export_s for r in exported}.items()))
    whole = [r for r in results if r.exporter == 'mmdeploy']
    notes = whole_notes(results)
    if notes:
        lines.append('')
        lines.append('Whole models in ' + _runtimes(whole) + ' (CPU), '
                     'ratios against the named baseline:')
        lines.extend('- ' + n for n in notes)
    if ort:
        lines.append('')
        lines.append('Exported models: each exported and checked once; '
                     'peak memory of each file in each runtime in a process '
                     'of its own (session loaded, warm-up and one run); the '
                     'times of a case\'s files in one process, alternating '
                     'from round to round.')
    profiled = profile_lines(results)
    if profiled:
        lines.append('')
        lines.append('ONNX Runtime profile (kernel time per run by part and '
                     'by operator, share of the model\'s kernel time):')
        lines.extend('- ' + p for p in profiled)
    return '\n'.join(lines)


def _runtimes(results: Sequence[BenchmarkResult]) -> str:
    """The runtimes of exported results with their versions, e.g.
    ``'ONNX Runtime 1.20.1 and OpenVINO 2025.1.0'``."""
    words = []
    for rt, label, key in (('onnxruntime', 'ONNX Runtime', 'ort_version'),
                           ('openvino', 'OpenVINO', 'ov_version')):
        if any(r.runtime == rt for r in results):
            versions = sorted({getattr(r, key) for r in results
                               if getattr(r, key)})
            words.append(f'{label} {", ".join(versions) or "?"}')
    return ' and '.join(words)


def plot_results(results: Sequence[BenchmarkResult], path: str) -> None:
    """Write a PNG of time and peak memory against input pixels.

    One line per (model, mode, runtime, batch); x is megapixels per
    image.

    Raises:
        RuntimeError: if matplotlib is not installed.
    """
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError(
            'plotting needs matplotlib: pip install matplotlib') from e
    series: Dict[str, List[BenchmarkResult]] = {}
    for r in results:
        if r.error is None:
            rt = '' if r.runtime == 'pytorch' else f' {r.runtime}'
            series.setdefault(f'{r.name} {r.mode}{rt} b{r.batch}',
                              []).append(r)
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, rs in series.items():
        rs = sorted({tuple(r.size): r for r in rs}.values(),
                    key=lambda r: r.size[0] * r.size[1])
        mp = [r.size[0] * r.size[1] / 1e6 for r in rs]
        style = '-o' if label.startswith('pola') else '--s'
        ax_t.plot(mp, [r.time_median for r in rs], style, label=label)
        ax_m.plot(mp, [r.peak_mem_mb / 1024 for r in rs], style, label=label)
    for ax, ylabel in ((ax_t, 'time per step (s)'),
                       (ax_m, 'peak memory (GiB)')):
        ax.set_xlabel('input megapixels (H x W / 1e6)')
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    ax_t.legend(fontsize='small')
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
