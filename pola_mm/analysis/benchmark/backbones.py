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

The softmax baselines are mmdet's ``SwinTransformer`` (configured as in
mmdet's Swin-T Mask R-CNN) and ``PyramidVisionTransformer`` (PVT-T, as in
mmdet's PVT RetinaNet). mmdet is imported only when such a model is built, in
the worker process.

``runtime='onnxruntime'`` measures inference of the exported backbone in
ONNX Runtime instead, checked against PyTorch first (see
:mod:`pola_mm.analysis.benchmark.onnxrt`).
"""
import copy
import statistics
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import (Any, Callable, Dict, List, Optional, Sequence, Tuple,
                    Union)

from mmengine.logging import print_log

from .worker import Size, StepMemory, measure_in, timed_steps

ModelSpec = Union[str, Dict[str, Any]]

#: Named models. A config dict is built with pola_mm's registry, unless it
#: holds ``_scope_='mmdet'``, in which case mmdet's registry builds it.
MODEL_ZOO: Dict[str, Dict[str, Any]] = {
    'pola_swin_t': dict(type='PolaSwinTransformer', arch='tiny'),
    'pola_swin_s': dict(type='PolaSwinTransformer', arch='small'),
    'pola_swin_b': dict(type='PolaSwinTransformer', arch='base'),
    'pola_pvt_t': dict(type='PolaPVT', arch='tiny'),
    'pola_pvt_s': dict(type='PolaPVT', arch='small'),
    'pola_pvt_m': dict(type='PolaPVT', arch='medium'),
    'pola_pvt_l': dict(type='PolaPVT', arch='large'),
    # PolaFormer++: the PaCS kernel, and the plain formula (fast paths off)
    'polapp_b2': dict(type='PolaPP', arch='b2'),
    'polapp_b2_plain': dict(
        type='pola_mm.analysis.benchmark.backbones:build_with_plain_paths',
        model='polapp_b2'),
    # mmdet configs/swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py
    'swin_t': dict(
        _scope_='mmdet',
        type='SwinTransformer',
        embed_dims=96,
        depths=[2, 2, 6, 2],
        num_heads=[3, 6, 12, 24],
        window_size=7,
        mlp_ratio=4,
        qkv_bias=True,
        qk_scale=None,
        drop_rate=0.,
        attn_drop_rate=0.,
        drop_path_rate=0.2,
        patch_norm=True,
        out_indices=(0, 1, 2, 3),
        with_cp=False,
        convert_weights=True),
    # mmdet configs/pvt/retinanet_pvt-t_fpn_1x_coco.py
    'pvt_t': dict(
        _scope_='mmdet', type='PyramidVisionTransformer',
        num_layers=[2, 2, 2, 2]),
}

#: The model each family is compared with (by name prefix, first match):
#: the softmax models for Pola-Swin/PVT; PolaPP-b2's kernel for its plain
#: formula, Pola-Swin-T for PolaPP.
BASELINES: Dict[str, str] = {
    'pola_swin': 'swin_t', 'pola_pvt': 'pvt_t',
    'polapp_b2_plain': 'polapp_b2', 'polapp': 'pola_swin_t'}


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
    cpu_ext: Optional[bool] = None
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


def baseline_of(name: str) -> Optional[str]:
    """The name of the softmax model that ``name`` is compared with."""
    for prefix, base in BASELINES.items():
        if name.startswith(prefix):
            return base
    return None


def build_benchmark_model(model: ModelSpec):
    """Build a backbone from a name of :data:`MODEL_ZOO` or a config dict.

    Args:
        model: a name of ``MODEL_ZOO`` or a config dict. A dict with
            ``_scope_='mmdet'`` is built by mmdet's registry (mmdet is imported
            here, never at import time of pola_mm); a dict whose ``type`` is
            ``'package.module:Name'`` calls that class or function with the
            other keys; any other dict is built by pola_mm's registry.

    Returns:
        torch.nn.Module: the backbone, mapping (B, 3, H, W) to a tensor or a
        tuple of tensors.
    """
    if isinstance(model, str):
        if model not in MODEL_ZOO:
            raise KeyError(f'unknown model {model!r}; known: '
                           f'{sorted(MODEL_ZOO)}')
        cfg = copy.deepcopy(MODEL_ZOO[model])
    else:
        cfg = copy.deepcopy(dict(model))
    scope = cfg.pop('_scope_', 'pola_mm')
    if isinstance(cfg.get('type'), str) and ':' in cfg['type']:
        # 'package.module:Name' -> any importable nn.Module class or factory
        import importlib
        mod_name, attr = cfg.pop('type').split(':', 1)
        return getattr(importlib.import_module(mod_name), attr)(**cfg)
    if scope == 'mmdet':
        import mmdet.models  # noqa: F401  (registers mmdet's backbones)
        from mmdet.registry import MODELS as MMDET_MODELS
        return MMDET_MODELS.build(cfg)
    if scope != 'pola_mm':
        raise ValueError(f'unsupported scope {scope!r}')
    import pola_mm  # noqa: F401  (registers the Pola backbones)
    from pola_mm.registry import MODELS
    return MODELS.build(cfg)


def build_with_plain_paths(model: ModelSpec):
    """:func:`build_benchmark_model` with every fast path off (the plain
    PyTorch formulas, see :mod:`pola_mm.ops.dispatch`) for the rest of this
    process; meant for the benchmark's one-model worker processes."""
    from pola_mm.ops import dispatch
    dispatch.set_fast_paths(False)
    return build_benchmark_model(model)


def _flatten(out: Any) -> List[Any]:
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flatten(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _flatten(o)]
    return [out]


def measure(model: ModelSpec,
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

    net = build_benchmark_model(model).to(dev)
    net.train(mode == 'train')
    h, w = parse_size(size)
    x = torch.randn(batch, 3, h, w, device=dev)

    def autocast():
        if amp_dtype is None:
            return nullcontext()
        return torch.autocast(dev.type, dtype=amp_dtype)

    def step() -> None:
        if mode == 'train':
            with autocast():
                outs = _flatten(net(x))
            loss = sum(o.float().mean() for o in outs)
            loss.backward()
            net.zero_grad(set_to_none=True)
        else:
            with torch.no_grad(), autocast():
                net(x)

    times, base, peak = timed_steps(step, dev, warmup, repeats)
    ext_mod = sys.modules.get('pola_mm.ops.cpu_ext')
    return dict(
        times=times,
        peak_mem_mb=peak,
        base_mem_mb=base,
        threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        num_params=sum(p.numel() for p in net.parameters()),
        # whether the steps ran pola_mm's fused CPU loops
        cpu_ext=bool(ext_mod and ext_mod.used()))


def benchmark_model(model: ModelSpec,
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
        model: a name of :data:`MODEL_ZOO` or a config dict (see
            :func:`build_benchmark_model`).
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
    return result.take(out, ('torch_version', 'num_params', 'cpu_ext'))


def _benchmark_onnxruntime(result: BenchmarkResult, model: ModelSpec,
                           warmup: int, repeats: int,
                           threads: Optional[int], isolate: bool,
                           timeout: Optional[float],
                           preload: Sequence[str], exporter: Optional[str],
                           opset: Optional[int], rtol: float,
                           profile_runs: int) -> BenchmarkResult:
    """The ONNX Runtime mode of :func:`benchmark_model`, filling
    ``result``."""
    from .onnxrt import DEFAULT_EXPORTER, run_onnxruntime
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
        preload = ['mmdet.models'] if any(
            MODEL_ZOO.get(m, {}).get('_scope_') == 'mmdet'
            for m in case.models) else []

        def measure_one(name: str) -> BenchmarkResult:
            res = benchmark_model(MODEL_ZOO.get(name, name), name=name,
                                  mode=case.mode, size=case.size,
                                  batch=case.batch, preload=preload,
                                  **kwargs)
            res.title = case.title
            return res

        results.extend(measure_in_rounds(case.models, rounds, measure_one,
                                         log, case.title))
    return results


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
    ratio over the family's softmax baseline in the same case; with ONNX
    Runtime results also the runtime in the mode column and the difference
    ONNX Runtime vs PyTorch relative to the output scale. Followed by the
    growth lines of :func:`compute_growth` and notes on the fused CPU loops
    (PyTorch) or the export (ONNX Runtime).
    """
    ratios = compute_ratios(results)
    ort = any(r.runtime == 'onnxruntime' for r in results)
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
    torch_cpu = [r for r in results if r.runtime == 'pytorch'
                 and r.device == 'cpu' and not r.error]
    if torch_cpu:
        fused = sorted({r.name for r in torch_cpu if r.cpu_ext})
        lines.append('')
        lines.append('Fused CPU loops (pola_mm/ops/csrc): ' + (
            'used by ' + ', '.join(fused) if fused else 'not used'))
    exported = [r for r in results if r.export_s is not None
                and r.exporter != 'mmdeploy']
    if exported:
        how = sorted({f'{r.exporter} exporter, opset {r.opset}'
                      for r in exported})
        versions = sorted({r.ort_version for r in exported if r.ort_version})
        lines.append('')
        lines.append(
            'ONNX Runtime ' + (', '.join(versions) or '?') + ' (CPU), '
            + '; '.join(how) + '; export time (s): ' + ', '.join(
                f'{r.name} {r.export_s:.1f}' for r in exported))
    from .whole import whole_notes
    notes = whole_notes(results)
    if notes:
        versions = sorted({r.ort_version for r in results
                           if r.exporter == 'mmdeploy' and r.ort_version})
        lines.append('')
        lines.append('Whole models in ONNX Runtime ' + (
            ', '.join(versions) or '?') + ' (CPU), ratios against the '
            'named baseline:')
        lines.extend('- ' + n for n in notes)
    from .ortprofile import profile_lines
    profiled = profile_lines(results)
    if profiled:
        lines.append('')
        lines.append('ONNX Runtime profile (kernel time per run by part and '
                     'by operator, share of the model\'s kernel time):')
        lines.extend('- ' + p for p in profiled)
    return '\n'.join(lines)


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
