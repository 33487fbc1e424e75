"""What a benchmark result holds and how rounds of results are pooled:
:class:`BenchmarkResult` (one model under one set of conditions, in any
runtime), input sizes (:func:`parse_size`, :func:`size_str`) and
:func:`measure_in_rounds`. The modes (:mod:`.backbones`, :mod:`.onnxrt`,
:mod:`.whole`) fill results, :mod:`.report` compares and prints them."""
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from .worker import Size, StepMemory

__all__ = ['BenchmarkResult', 'parse_size', 'size_str', 'measure_in_rounds']


@dataclass
class _BackboneKey:
    """What a :class:`BenchmarkResult` measured (its required fields)."""
    name: str
    mode: str
    size: Size
    batch: int
    device: str
    dtype: str


@dataclass
class BenchmarkResult(StepMemory, _BackboneKey):
    """One model measured under one set of conditions.

    The steps, memory and ``error`` are those of
    :class:`~pola_mm.analysis.benchmark.worker.StepMemory`; built as
    ``BenchmarkResult(name, mode, size, batch, device, dtype, ...)``.
    """
    time_min: Optional[float] = None
    torch_version: Optional[str] = None
    num_params: Optional[int] = None
    title: str = ''
    #: ``'pytorch'`` or ``'onnxruntime'``; the ONNX Runtime mode also fills
    #: the fields below (see :mod:`pola_mm.analysis.benchmark.onnxrt`).
    runtime: str = 'pytorch'
    #: Largest max abs difference ONNX Runtime vs PyTorch over the outputs,
    #: relative to each output's scale.
    onnx_rel_diff: Optional[float] = None
    exporter: Optional[str] = None
    opset: Optional[int] = None
    export_s: Optional[float] = None
    ort_version: Optional[str] = None
    #: The model the ratios compare this one with; None: the family's
    #: baseline (:func:`baseline_of`). Whole models set it (see
    #: :mod:`pola_mm.analysis.benchmark.whole`).
    baseline: Optional[str] = None
    #: Whole models: the check against PyTorch in words, the deploy config
    #: and the weights (``'random'`` or a checkpoint's file name).
    check: Optional[str] = None
    deploy_cfg: Optional[str] = None
    weights: Optional[str] = None
    #: ONNX Runtime's profile of the model, when asked for: kernel time per
    #: run by part and by operator type (see
    #: :func:`~pola_mm.analysis.benchmark.ortprofile.profile_onnxruntime`).
    ort_profile: Optional[Dict[str, Any]] = None

    def take(self, out: Dict[str, Any], keys: Sequence[str]
             ) -> 'BenchmarkResult':
        """Fill this result from a worker's ``out``: the fields ``keys``,
        then its ``error``, or its steps (:meth:`record`) and fastest step.
        Returns ``self``."""
        for key in keys:
            setattr(self, key, out.get(key))
        if 'error' in out:
            self.error = out['error']
            return self
        self.record(out)
        self.time_min = min(self.times)
        return self


def parse_size(text: Union[str, int, Sequence[int]]) -> Size:
    """``'224'`` -> (224, 224); ``'800x1344'`` -> (800, 1344) as (H, W)."""
    if isinstance(text, int):
        return (text, text)
    if not isinstance(text, str):
        h, w = text
        return (int(h), int(w))
    parts = text.lower().split('x')
    if len(parts) == 1:
        return (int(parts[0]), int(parts[0]))
    if len(parts) != 2:
        raise ValueError(f'size must be N or HxW, got {text!r}')
    return (int(parts[0]), int(parts[1]))


def size_str(size: Size) -> str:
    """(800, 1344) -> ``'800x1344'``; (224, 224) -> ``'224'``."""
    return str(size[0]) if size[0] == size[1] else f'{size[0]}x{size[1]}'


def _merge(a: BenchmarkResult, b: BenchmarkResult) -> BenchmarkResult:
    """Pool the rounds of one measurement: all times, the largest peak (and
    the largest ONNX Runtime difference)."""
    if a.error or b.error:
        return a if a.error else b
    a.times = a.times + b.times
    a.time_median = statistics.median(a.times)
    a.time_min = min(a.times)
    a.peak_mem_mb = max(a.peak_mem_mb, b.peak_mem_mb)
    a.base_mem_mb = max(a.base_mem_mb, b.base_mem_mb)
    if a.onnx_rel_diff is not None and b.onnx_rel_diff is not None:
        a.onnx_rel_diff = max(a.onnx_rel_diff, b.onnx_rel_diff)
    a.ort_profile = a.ort_profile or b.ort_profile
    return a


def measure_in_rounds(names: Sequence[str], rounds: int,
                      measure: Callable[[str], BenchmarkResult],
                      log: Callable[[str], None],
                      title: str) -> List[BenchmarkResult]:
    """``measure`` each of ``names`` ``rounds`` times, the order
    alternating from round to round (so that a change of the machine's load
    falls on both sides of a ratio), logging a line after each; the rounds
    of a name are pooled (:func:`_merge`). Returns one result per name, in
    order."""
    pooled: Dict[str, BenchmarkResult] = {}
    for r in range(rounds):
        order = list(names) if r % 2 == 0 else list(reversed(names))
        for name in order:
            res = measure(name)
            if res.error:
                what = f'error {res.error}'
            else:
                what = (f'{res.time_median:.3f} s, '
                        f'peak {res.peak_mem_mb:.0f} MiB')
                if res.check:
                    what += (f', export and check {res.export_s:.0f} s, '
                             f'{res.check}')
            log(f'[{title}] round {r + 1}/{rounds} {name}: {what}')
            pooled[name] = _merge(pooled[name], res) if name in pooled \
                else res
    return [pooled[name] for name in names]
