"""What a benchmark result holds and the one runner of every mode:
:class:`BenchmarkResult` (one model under one set of conditions, in any
runtime), input sizes (:func:`parse_size`, :func:`size_str`) and
:func:`measure_in_rounds` (rounds in alternating order, pooled and logged,
with an optional stop rule). The modes (:mod:`.backbones`, :mod:`.onnxrt`,
:mod:`.whole`, :mod:`.seqlen`) go through it, :mod:`.report` compares and
prints their results."""
from dataclasses import dataclass
from typing import (Any, Callable, Dict, List, Optional, Sequence, TypeVar,
                    Union)

from mmengine.logging import print_log

from .worker import Size, StepMemory

__all__ = ['BenchmarkResult', 'parse_size', 'size_str', 'measure_in_rounds',
           'print_line']


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
    #: ``'pytorch'``, ``'onnxruntime'`` or ``'openvino'``; the last two
    #: time an exported file and fill the fields below (see
    #: :mod:`pola_mm.analysis.benchmark.onnxrt`).
    runtime: str = 'pytorch'
    #: Largest max abs difference ONNX Runtime vs PyTorch over the outputs,
    #: relative to each output's scale (the check of the exported file, in
    #: either runtime's rows).
    onnx_rel_diff: Optional[float] = None
    exporter: Optional[str] = None
    opset: Optional[int] = None
    export_s: Optional[float] = None
    ort_version: Optional[str] = None
    ov_version: Optional[str] = None
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

    def record(self, out: Dict[str, Any]) -> None:
        """The steps of :meth:`StepMemory.record` and the fastest one."""
        super().record(out)
        self.time_min = min(self.times)

    def take(self, out: Dict[str, Any], keys: Sequence[str]
             ) -> 'BenchmarkResult':
        """Fill this result from a worker's ``out``: the fields ``keys``,
        then its ``error``, or its steps (:meth:`record`). Returns
        ``self``."""
        for key in keys:
            setattr(self, key, out.get(key))
        if 'error' in out:
            self.error = out['error']
        else:
            self.record(out)
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


def print_line(msg: str) -> None:
    """The default log of the benchmarks: mmengine's current logger."""
    print_log(msg, logger='current')


R = TypeVar('R', bound=StepMemory)


def measure_in_rounds(names: Sequence[str],
                      measure: Callable[[str], R],
                      rounds: int = 1,
                      log: Optional[Callable[[str], None]] = None,
                      title: str = '',
                      stop: Optional[Callable[[R], Optional[str]]] = None,
                      skip: Optional[Callable[[str, str], R]] = None
                      ) -> List[R]:
    """The runner of every benchmark mode: ``measure`` each of ``names``
    ``rounds`` times, the order alternating from round to round (ABC, CBA,
    ...: a change of the machine's load falls on both sides of a ratio),
    logging a line after each (``[title] round r/R name: ...``, without
    the round when there is one), the rounds of a name pooled
    (:meth:`~pola_mm.analysis.benchmark.worker.StepMemory.pool`). A name
    whose result has no times (failed or skipped) is not measured again.

    Args:
        names: what to measure, in the order of the first round.
        measure: one measurement of a name.
        rounds: how many times to measure each name.
        log: called with each line (default :func:`print_line`).
        title: the title of the log lines.
        stop: called with each result; a reason (a string) stops the
            runner: the names not measured yet are not measured, their
            results are ``skip(name, reason)``.
        skip: see ``stop``.

    Returns:
        One result per name, in the order of ``names``.
    """
    log = log or print_line
    pooled: Dict[str, R] = {}
    reason: Optional[str] = None
    for r in range(rounds):
        for name in (names if r % 2 == 0 else list(reversed(names))):
            old = pooled.get(name)
            if old is not None and (reason is not None or not old.times):
                continue
            res = measure(name) if reason is None else skip(name, reason)
            log(f'[{title}] ' + (f'round {r + 1}/{rounds} ' if rounds > 1
                                 else '') + f'{name}: {res.summary()}')
            pooled[name] = res if old is None else old.pool(res)
            if stop is not None and reason is None:
                reason = stop(res)
    return [pooled[name] for name in names]
