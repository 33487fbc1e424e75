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

``runtime='onnxruntime'`` measures inference of the exported backbone in
ONNX Runtime instead, checked against PyTorch first (see
:mod:`pola_mm.analysis.benchmark.onnxrt`).
"""
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from mmengine.logging import print_log

from ..zoo import Spec, backbone_config, build
from .onnxrt import DEFAULT_EXPORTER, run_onnxruntime
from .results import BenchmarkResult, measure_in_rounds, parse_size
from .worker import Size, measure_in, timed_steps

__all__ = ['BenchmarkCase', 'PRESETS', 'measure', 'benchmark_model',
           'run_benchmarks']


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
                    exporter: Optional[str] = None,
                    opset: Optional[int] = None,
                    rtol: float = 1e-4,
                    profile_runs: int = 0) -> BenchmarkResult:
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
        runtime: ``'pytorch'``, or ``'onnxruntime'``: export the backbone,
            check ONNX Runtime against PyTorch, time ``session.run`` (CPU,
            float32, inference only; see
            :mod:`pola_mm.analysis.benchmark.onnxrt`).
        exporter: the exporter of the ONNX Runtime mode (default
            ``'torchscript'``; ``'dynamo'`` for a batch other than 1).
        opset: the ONNX opset of the ONNX Runtime mode (default: the
            exporter's).
        rtol: the ONNX Runtime mode fails a model whose outputs differ from
            PyTorch's by more than this fraction of their scale.
        profile_runs: the ONNX Runtime mode, if positive: after the timed
            runs, this many runs under ONNX Runtime's profiler give
            ``ort_profile`` (see
            :mod:`pola_mm.analysis.benchmark.ortprofile`).

    Returns:
        BenchmarkResult: with ``error`` set if the measurement failed.
    """
    hw = parse_size(size)
    if name is None:
        name = model if isinstance(model, str) else 'custom'
    result = BenchmarkResult(
        name=name, mode=mode, size=hw, batch=batch, device=device,
        dtype=dtype, runtime=runtime)
    if runtime == 'onnxruntime':
        return _benchmark_onnxruntime(result, model, warmup, repeats,
                                      threads, isolate, timeout, preload,
                                      exporter, opset, rtol, profile_runs)
    if runtime != 'pytorch':
        raise ValueError(f"runtime must be 'pytorch' or 'onnxruntime', got "
                         f'{runtime!r}')
    job = dict(model=model, mode=mode, size=list(hw), batch=batch,
               device=device, dtype=dtype, warmup=warmup, repeats=repeats,
               threads=threads, preload=list(preload))
    out = measure_in('pola_mm.analysis.benchmark.backbones:measure', job,
                     isolate, timeout)
    return result.take(out, ('torch_version', 'num_params'))


def _benchmark_onnxruntime(result: BenchmarkResult, model: Spec,
                           warmup: int, repeats: int,
                           threads: Optional[int], isolate: bool,
                           timeout: Optional[float],
                           preload: Sequence[str], exporter: Optional[str],
                           opset: Optional[int], rtol: float,
                           profile_runs: int) -> BenchmarkResult:
    """The ONNX Runtime mode of :func:`benchmark_model`, filling
    ``result``."""
    result.exporter = exporter or DEFAULT_EXPORTER
    if result.mode != 'infer' or result.device != 'cpu' or \
            result.dtype not in ('float32', 'fp32'):
        result.error = ('the onnxruntime runtime measures inference on the '
                        'CPU in float32 only (got mode '
                        f'{result.mode}, device {result.device}, dtype '
                        f'{result.dtype})')
        return result
    out = run_onnxruntime(model, size=result.size, batch=result.batch,
                          warmup=warmup, repeats=repeats, threads=threads,
                          exporter=result.exporter, opset=opset, rtol=rtol,
                          isolate=isolate, timeout=timeout, preload=preload,
                          profile_runs=profile_runs)
    return result.take(out, ('onnx_rel_diff', 'opset', 'export_s',
                             'torch_version', 'num_params', 'ort_version',
                             'ort_profile'))


def run_benchmarks(cases: Sequence[BenchmarkCase],
                   rounds: int = 1,
                   log: Optional[Callable[[str], None]] = None,
                   **kwargs: Any) -> List[BenchmarkResult]:
    """Measure every model of every case, each in its own process.

    With ``rounds > 1`` every case is measured ``rounds`` times, the models
    of a case alternating in order from round to round, so that a change of
    the machine's load during the run falls on both sides of a ratio. The
    times of all rounds are pooled (median over all), the peak memory is the
    largest of the rounds.

    Args:
        cases: the cases to run.
        rounds: how many times to measure each case.
        log: called with a line after each measurement (default: print_log).
        **kwargs: passed to :func:`benchmark_model` (device, dtype, warmup,
            repeats, threads, timeout, isolate, runtime, exporter, opset,
            profile_runs).

    Returns:
        list[BenchmarkResult]: one per case and model, in case order.
    """
    if log is None:
        def log(msg: str) -> None:
            print_log(msg, logger='current')
    results: List[BenchmarkResult] = []
    for case in cases:
        # Every process of a comparison imports the same libraries.
        specs = {m: backbone_config(m) for m in case.models}
        preload = ['mmdet.models'] if any(
            s['_scope_'] == 'mmdet' for s in specs.values()) else []

        def measure_one(name: str, specs: dict = specs, case: Any = case,
                        preload: List[str] = preload) -> BenchmarkResult:
            res = benchmark_model(specs[name], name=name,
                                  mode=case.mode, size=case.size,
                                  batch=case.batch, preload=preload,
                                  **kwargs)
            res.title = case.title
            return res

        results.extend(measure_in_rounds(case.models, rounds, measure_one,
                                         log, case.title))
    return results
