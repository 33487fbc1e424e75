"""The backbone benchmark: time and peak memory of backbones, Pola and
softmax side by side.

A measurement (each in its own process, see
:mod:`pola_mm.analysis.benchmark.worker`) is: build the backbone, make a
random input of shape (batch, 3, H, W), run ``warmup`` untimed steps, then
``repeats`` timed steps, and report the median time. A step is either an
inference forward under ``torch.no_grad()`` (``mode='infer'``) or a training
step, forward + backward of the sum of the means of all outputs
(``mode='train'``, no optimiser step). Peak and base memory are as described
in :mod:`pola_mm.analysis.benchmark.worker`.

The models are those of :mod:`pola_mm.analysis.zoo` (names read from the
backbones' ``arch_zoo``; the softmax baselines are mmdet's
``SwinTransformer`` and ``PyramidVisionTransformer`` at the same widths,
depths, heads and drop path), or any config dict the zoo's builder takes.
mmdet is imported only when such a model is built, in the worker process.

``runtime='onnxruntime'`` and/or ``'openvino'`` measure inference of the
exported backbones instead, each exported and checked against PyTorch once,
the files of a case timed alternately in one process (see
:mod:`pola_mm.analysis.benchmark.onnxrt`).
"""
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from ..zoo import Spec, backbone_config, build
from .onnxrt import (DEFAULT_EXPORTER, EXPORTED_RUNTIMES, RUNTIMES,
                     VERSION_KEYS, measure_exported)
from .results import BenchmarkResult, measure_in_rounds, parse_size
from .worker import Size, measure_in, timed_steps

__all__ = ['BenchmarkCase', 'PRESETS', 'measure', 'benchmark_model',
           'measure_case_exported', 'run_benchmarks']


@dataclass
class BenchmarkCase:
    """A group of models measured under the same conditions."""
    title: str
    models: Sequence[str]
    mode: str
    size: Size
    batch: int


#: Named lists of cases. ``goals``: training at 224 and inference at
#: detection sizes (the cases whose ratios ``tools/analysis/benchmark.py
#: --preset goals`` compares with the performance goals).
PRESETS: Dict[str, List[BenchmarkCase]] = {
    'goals': [
        BenchmarkCase('Swin-T train 224 b8', ('pola_swin_t', 'swin_t'),
                      'train', (224, 224), 8),
        BenchmarkCase('PVT-T train 224 b8', ('pola_pvt_t', 'pvt_t'), 'train',
                      (224, 224), 8),
        BenchmarkCase('Swin-T infer 800x1344', ('pola_swin_t', 'swin_t'),
                      'infer', (800, 1344), 1),
        BenchmarkCase('Swin-T infer 1600x2688', ('pola_swin_t', 'swin_t'),
                      'infer', (1600, 2688), 1),
        BenchmarkCase('PVT-T infer 800x1344', ('pola_pvt_t', 'pvt_t'),
                      'infer', (800, 1344), 1),
        BenchmarkCase('PVT-T infer 1600x2688', ('pola_pvt_t', 'pvt_t'),
                      'infer', (1600, 2688), 1),
    ],
    # PolaPP-b2 (PolaFormer++): PaCS kernel vs the plain formula vs
    # Pola-Swin-T, at equal input.
    'polapp': [
        BenchmarkCase('PolaPP-b2 train 224 b8',
                      ('polapp_b2', 'polapp_b2_plain', 'pola_swin_t'),
                      'train', (224, 224), 8),
        BenchmarkCase('PolaPP-b2 infer 800x1344',
                      ('polapp_b2', 'polapp_b2_plain', 'pola_swin_t'),
                      'infer', (800, 1344), 1),
    ],
    # The same comparisons at sizes that take seconds, for a quick look.
    'small': [
        BenchmarkCase('Swin-T train 224 b2', ('pola_swin_t', 'swin_t'),
                      'train', (224, 224), 2),
        BenchmarkCase('PVT-T train 224 b2', ('pola_pvt_t', 'pvt_t'), 'train',
                      (224, 224), 2),
        BenchmarkCase('Swin-T infer 512x512', ('pola_swin_t', 'swin_t'),
                      'infer', (512, 512), 1),
        BenchmarkCase('PVT-T infer 512x512', ('pola_pvt_t', 'pvt_t'),
                      'infer', (512, 512), 1),
    ],
}


def _flatten(out: Any) -> List[Any]:
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flatten(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _flatten(o)]
    return [out]


def measure(model: Spec,
            mode: str = 'infer',
            size: Size = (224, 224),
            batch: int = 1,
            device: str = 'cpu',
            dtype: str = 'float32',
            warmup: int = 1,
            repeats: int = 3,
            threads: Optional[int] = None,
            seed: int = 0,
            preload: Sequence[str] = ()) -> Dict[str, Any]:
    """Measure one model in the current process (see :func:`benchmark_model`).

    Memory numbers are only meaningful when this process runs nothing else,
    which is why :func:`benchmark_model` calls this in a fresh process.
    ``preload`` names modules imported first, so that the processes being
    compared hold the same libraries (their memory is in the peak RSS).

    Returns:
        dict with ``times`` (list of seconds), ``peak_mem_mb``,
        ``base_mem_mb``, ``threads``, ``torch_version``, ``num_params``.
    """
    import importlib

    import torch
    for mod in preload:
        importlib.import_module(mod)
    if mode not in ('infer', 'train'):
        raise ValueError(f"mode must be 'infer' or 'train', got {mode!r}")
    if threads:
        torch.set_num_threads(int(threads))
    torch.manual_seed(seed)
    dtypes = {'float32': None, 'fp32': None, 'bf16': torch.bfloat16,
              'bfloat16': torch.bfloat16, 'fp16': torch.float16,
              'float16': torch.float16}
    if dtype not in dtypes:
        raise ValueError(f'unsupported dtype {dtype!r}; one of {list(dtypes)}')
    amp_dtype = dtypes[dtype]
    dev = torch.device(device)

    built = build(model)
    net = built.model.to(dev)
    net.train(mode == 'train')
    forward = built.forward
    h, w = parse_size(size)
    x = torch.randn(batch, 3, h, w, device=dev)

    def autocast():
        if amp_dtype is None:
            return nullcontext()
        return torch.autocast(dev.type, dtype=amp_dtype)

    def step() -> None:
        if mode == 'train':
            with autocast():
                outs = _flatten(forward(x))
            loss = sum(o.float().mean() for o in outs)
            loss.backward()
            net.zero_grad(set_to_none=True)
        else:
            with torch.no_grad(), autocast():
                forward(x)

    with built.paths():
        times, base, peak = timed_steps(step, dev, warmup, repeats)
    return dict(
        times=times,
        peak_mem_mb=peak,
        base_mem_mb=base,
        threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        num_params=sum(p.numel() for p in net.parameters()))


def benchmark_model(model: Spec,
                    mode: str = 'infer',
                    size: Union[Size, str, int] = (224, 224),
                    batch: int = 1,
                    device: str = 'cpu',
                    dtype: str = 'float32',
                    warmup: int = 1,
                    repeats: int = 3,
                    threads: Optional[int] = None,
                    isolate: bool = True,
                    timeout: Optional[float] = None,
                    name: Optional[str] = None,
                    preload: Sequence[str] = (),
                    runtime: str = 'pytorch',
                    **exported: Any) -> BenchmarkResult:
    """Time and peak memory of one backbone step.

    Args:
        model: a name of :func:`~pola_mm.analysis.zoo.zoo` or a config
            dict (see :func:`~pola_mm.analysis.zoo.build`).
        mode: ``'infer'`` (forward under ``no_grad``, eval mode) or
            ``'train'`` (forward + backward, train mode).
        size: input (H, W), an int for square, or a string ``'HxW'``.
        batch: batch size B of the input (B, 3, H, W).
        device: ``'cpu'`` or ``'cuda'`` (``'cuda:N'``).
        dtype: ``'float32'``, or ``'bf16'`` / ``'fp16'`` for autocast.
        warmup: untimed steps before the timed ones.
        repeats: timed steps; the result holds all and their median.
        threads: ``torch.set_num_threads`` in the worker (None: torch's
            default).
        isolate: run in a fresh process (honest peak memory). False measures
            in this process; its peak memory then includes all that this
            process did before.
        timeout: seconds after which an isolated worker is killed and the
            result holds an error.
        name: the name in the result (default: the model name, or
            ``'custom'`` for a dict).
        preload: modules the worker imports before building the model (the
            same for every model of a comparison, so that library memory
            does not bias the peak-memory ratio).
        runtime: ``'pytorch'``, ``'onnxruntime'`` or ``'openvino'``: export
            the backbone, check ONNX Runtime against PyTorch, time the file
            (CPU, float32, inference only; see
            :mod:`pola_mm.analysis.benchmark.onnxrt`).
        **exported: the options of those runtimes: ``exporter`` (default
            ``'torchscript'``; ``'dynamo'`` for a batch other than 1),
            ``opset`` (default: the exporter's), ``rtol`` (a model whose
            outputs differ from PyTorch's by more than this fraction of
            their scale fails; default 1e-4), ``profile_runs`` (ONNX
            Runtime's profile of that many runs, ``ort_profile``; see
            :mod:`pola_mm.analysis.benchmark.ortprofile`).

    Returns:
        BenchmarkResult: with ``error`` set if the measurement failed.
    """
    hw = parse_size(size)
    if name is None:
        name = model if isinstance(model, str) else 'custom'
    if runtime not in RUNTIMES:
        raise ValueError(f'runtime must be one of {RUNTIMES}, got '
                         f'{runtime!r}')
    if runtime != 'pytorch':
        return measure_case_exported(
            BenchmarkCase('', (name, ), mode, hw, batch), {name: model},
            (runtime, ), device=device, dtype=dtype, warmup=warmup,
            repeats=repeats, threads=threads, isolate=isolate,
            timeout=timeout, preload=preload, log=lambda _: None,
            **exported)[0]
    job = dict(model=model, mode=mode, size=list(hw), batch=batch,
               device=device, dtype=dtype, warmup=warmup, repeats=repeats,
               threads=threads, preload=list(preload))
    out = measure_in('pola_mm.analysis.benchmark.backbones:measure', job,
                     isolate, timeout)
    return BenchmarkResult(name, mode, hw, batch, device, dtype).take(
        out, ('torch_version', 'num_params'))


def measure_case_exported(case: BenchmarkCase,
                          specs: Dict[str, Spec],
                          runtimes: Sequence[str] = ('onnxruntime', ),
                          rounds: int = 1,
                          device: str = 'cpu',
                          dtype: str = 'float32',
                          preload: Sequence[str] = (),
                          exporter: Optional[str] = None,
                          opset: Optional[int] = None,
                          rtol: float = 1e-4,
                          **kwargs: Any) -> List[BenchmarkResult]:
    """The models of a case exported and timed in ``runtimes``
    (:func:`~pola_mm.analysis.benchmark.onnxrt.measure_exported`).

    Args:
        case: the case (CPU, float32 inference only).
        specs: model name -> the model (see :func:`benchmark_model`).
        runtimes: some of ``('onnxruntime', 'openvino')``.
        rounds, **kwargs: see :func:`~pola_mm.analysis.benchmark.onnxrt.
            measure_exported` (warmup, repeats, threads, isolate, timeout,
            profile_runs, log).
        device, dtype, preload, exporter, opset, rtol: see
            :func:`benchmark_model`.

    Returns:
        One result per runtime and model, runtime by runtime.
    """
    exporter = exporter or DEFAULT_EXPORTER
    results = {(rt, n): BenchmarkResult(
        n, case.mode, case.size, case.batch, device, dtype, runtime=rt,
        exporter=exporter, title=case.title)
        for rt in runtimes for n in case.models}
    if case.mode != 'infer' or device != 'cpu' or \
            dtype not in ('float32', 'fp32'):
        for r in results.values():
            r.error = ('exported models are measured in inference on the '
                       'CPU in float32 only (got mode '
                       f'{case.mode}, device {device}, dtype {dtype})')
        return list(results.values())
    jobs = {n: dict(model=specs[n], size=list(case.size), batch=case.batch,
                    exporter=exporter, opset=opset,
                    threads=kwargs.get('threads'), rtol=rtol,
                    preload=list(preload)) for n in case.models}
    outs = measure_exported(
        'pola_mm.analysis.benchmark.onnxrt:export_and_check', jobs,
        runtimes, rounds=rounds, title=case.title, **kwargs)
    return [r.take(outs[key], ('onnx_rel_diff', 'opset', 'export_s',
                               'torch_version', 'num_params', 'ort_profile',
                               VERSION_KEYS[key[0]]))
            for key, r in results.items()]


def run_benchmarks(cases: Sequence[BenchmarkCase],
                   rounds: int = 1,
                   log: Optional[Callable[[str], None]] = None,
                   runtime: Union[str, Sequence[str]] = 'pytorch',
                   **kwargs: Any) -> List[BenchmarkResult]:
    """Measure every model of every case, each in its own process (the
    exported runtimes: see :func:`measure_case_exported`).

    With ``rounds > 1`` every case is measured ``rounds`` times, the models
    of a case alternating in order from round to round, so that a change of
    the machine's load during the run falls on both sides of a ratio
    (:func:`~pola_mm.analysis.benchmark.results.measure_in_rounds`). The
    times of all rounds are pooled (median over all), the peak memory is the
    largest of the rounds.

    Args:
        cases: the cases to run.
        rounds: how many times to measure each case.
        log: called with a line after each measurement (default: print_log).
        runtime: ``'pytorch'``, or one or more of ``'onnxruntime'`` and
            ``'openvino'`` (timed from one export).
        **kwargs: passed to :func:`benchmark_model` (device, dtype, warmup,
            repeats, threads, timeout, isolate, exporter, opset, rtol,
            profile_runs).

    Returns:
        list[BenchmarkResult]: one per case and model (and runtime), in case
        order.
    """
    runtimes = [runtime] if isinstance(runtime, str) else list(runtime)
    exported = [r for r in runtimes if r in EXPORTED_RUNTIMES]
    if runtimes != ['pytorch'] and exported != runtimes:
        raise ValueError(f"runtime must be 'pytorch' or some of "
                         f'{EXPORTED_RUNTIMES}, got {runtime!r}')
    results: List[BenchmarkResult] = []
    for case in cases:
        # Every process of a comparison imports the same libraries.
        specs = {m: backbone_config(m) for m in case.models}
        preload = ['mmdet.models'] if any(
            s['_scope_'] == 'mmdet' for s in specs.values()) else []
        if exported:
            results += measure_case_exported(case, specs, exported, rounds,
                                             log=log, preload=preload,
                                             **kwargs)
            continue

        def measure_one(name: str, specs: dict = specs, case: Any = case,
                        preload: List[str] = preload) -> BenchmarkResult:
            res = benchmark_model(specs[name], name=name, mode=case.mode,
                                  size=case.size, batch=case.batch,
                                  preload=preload, **kwargs)
            res.title = case.title
            return res

        results += measure_in_rounds(case.models, measure_one, rounds, log,
                                     case.title)
    return results
