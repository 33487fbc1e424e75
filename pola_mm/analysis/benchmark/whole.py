"""Whole detectors in ONNX Runtime (and OpenVINO): exported by MMDeploy,
checked against PyTorch and timed, Pola and softmax side by side.

``tools/analysis/benchmark.py --runtime onnxruntime --whole NAME|CONFIG ...``
measures the models through the steps of the backbone mode
(:func:`pola_mm.analysis.benchmark.onnxrt.measure_exported`, each in
worker processes), with MMDeploy's export:

1. :func:`export_whole` reads the model config, drops its pretrained
   weights (``model.pretrained`` and the backbone's ``init_cfg`` become
   None, so a missing checkpoint stops nothing), builds the model through
   MMDeploy's task processor, seeds and runs its ``init_weights`` (random
   weights unless the model names a ``checkpoint``; the heads get mmdet's
   own initialisation, e.g. RetinaNet's prior on the class scores) and hands
   those weights to :func:`pola_mm.deployment.mmdeploy_verify.
   deploy_and_verify`: MMDeploy's ``torch2onnx`` with the stock static
   ONNX Runtime deploy config (instance-seg for a model with a mask head,
   detection otherwise), its ``input_shape`` set to the benchmark's size,
   then MMDeploy's ONNX Runtime backend model and PyTorch on the same image
   (a seeded noise image unless the model names one), every confident
   detection compared. A file that disagrees fails the model.
2. Peak memory of each file in each runtime in a process of its own, then
   all files timed alternately in one process, on a seeded normal input of
   the file's (static) input shape, as for backbones.

Each result names its baseline (``baseline``), the model its time and
memory ratios are computed against.

With random weights the detectors find nothing confident (RetinaNet's
scores sit at its 0.01 prior, Mask R-CNN's box head spreads over 81
classes), so the check against PyTorch compares no detections and the
post-processing after the heads (NMS, the mask head on the detections) is
cheaper than with trained weights, equally for both sides of a pair: what
differs between them is the backbone (and the channels of the neck's
inputs).
"""
import copy
import os
import os.path as osp
import time
from typing import Any, Dict, List, Optional, Sequence, Union

from .onnxrt import VERSION_KEYS, measure_exported, opset_of
from .results import BenchmarkResult, parse_size, size_str
from .worker import Size

__all__ = [
    'WHOLE_MODELS', 'STOCK_DEPLOY_CONFIGS', 'WholeSpec', 'resolve_config',
    'stock_deploy_config', 'whole_spec',
    'export_whole', 'run_whole_benchmarks', 'whole_notes'
]

#: A whole model: a zoo name, a config file or a dict with ``config`` and
#: optionally ``name``, ``baseline``, ``checkpoint``, ``cfg_options``,
#: ``deploy_cfg`` and ``image``.
WholeSpec = Union[str, Dict[str, Any]]

#: mmdet's PVT-T backbone, as in mmdet's configs/pvt/retinanet_pvt-t_fpn_
#: 1x_coco.py (without its pretrained weights).
_MMDET_PVT_T = dict(_delete_=True, type='PyramidVisionTransformer',
                    num_layers=[2, 2, 2, 2], init_cfg=None)

#: Named whole models. ``config`` is a file of this repository (relative to
#: its root) or ``mmdet::PATH`` (mmdet's own configs). mmdet has no PVT Mask
#: R-CNN, so that baseline is pola_mm's config with mmdet's PVT-T backbone
#: in place of Pola-PVT-T (same neck channels, same heads).
WHOLE_MODELS: Dict[str, Dict[str, Any]] = {
    'mask_rcnn_pola_swin_t': dict(config='configs/mask_rcnn_pola_swin_t.py',
                                  baseline='mask_rcnn_swin_t'),
    'mask_rcnn_swin_t': dict(
        config='mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'),
    'retinanet_pola_pvt_t': dict(config='configs/retinanet_pola_pvt_t.py',
                                 baseline='retinanet_pvt_t'),
    'retinanet_pvt_t': dict(
        config='mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py'),
    'mask_rcnn_pola_pvt_t': dict(config='configs/mask_rcnn_pola_pvt_t.py',
                                 baseline='mask_rcnn_pvt_t'),
    'mask_rcnn_pvt_t': dict(config='configs/mask_rcnn_pola_pvt_t.py',
                            cfg_options={'model.backbone': _MMDET_PVT_T}),
}

#: MMDeploy's stock static ONNX Runtime deploy configs, relative to a
#: MMDeploy checkout's ``configs`` (shipped byte for byte with pola_mm in
#: pola_mm/.mim/mmdeploy_configs).
STOCK_DEPLOY_CONFIGS = {
    'detection': 'mmdet/detection/detection_onnxruntime_static.py',
    'instance-seg': 'mmdet/instance-seg/instance-seg_onnxruntime_static.py',
}


def _repo_root() -> str:
    """The directory holding the ``pola_mm`` package (a checkout's root)."""
    return osp.dirname(osp.dirname(osp.dirname(osp.dirname(
        osp.abspath(__file__)))))


def resolve_config(path: str) -> str:
    """The file of a config name: ``mmdet::X`` is mmdet's installed
    ``.mim/configs/X``; a relative path not found from the working
    directory is tried from the repository root.

    Raises:
        FileNotFoundError: no such file.
    """
    if path.startswith('mmdet::'):
        import mmdet
        found = osp.join(osp.dirname(mmdet.__file__), '.mim', 'configs',
                         path[len('mmdet::'):])
    elif osp.isfile(path) or osp.isabs(path):
        found = path
    else:
        found = osp.join(_repo_root(), path)
    if not osp.isfile(found):
        raise FileNotFoundError(f'config not found: {path}')
    return found


def stock_deploy_config(kind: str) -> str:
    """The stock static ONNX Runtime deploy config of ``kind``
    (``'detection'`` or ``'instance-seg'``): under
    ``$POLA_MM_MMDEPLOY_ROOT/configs`` if that is set, else the copies
    that ship with pola_mm (pola_mm/.mim/mmdeploy_configs).

    Raises:
        FileNotFoundError: neither has the file (pass a deploy config).
    """
    root = os.environ.get('POLA_MM_MMDEPLOY_ROOT') or osp.join(
        osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))),
        '.mim', 'mmdeploy_configs')
    path = osp.join(root, 'configs', STOCK_DEPLOY_CONFIGS[kind])
    if not osp.isfile(path):
        raise FileNotFoundError(
            f'no stock deploy config at {path}: set POLA_MM_MMDEPLOY_ROOT '
            'to a checkout of MMDeploy, or give the model a deploy_cfg')
    return path


def whole_spec(model: WholeSpec) -> Dict[str, Any]:
    """A whole model as a dict with ``name``, ``config``, ``baseline``,
    ``checkpoint``, ``cfg_options``, ``deploy_cfg`` and ``image`` (None
    where not given).

    A zoo name takes its entry of :data:`WHOLE_MODELS`; a config file is
    named after its file name (without ``.py``).
    """
    if isinstance(model, str):
        if model in WHOLE_MODELS:
            spec = dict(copy.deepcopy(WHOLE_MODELS[model]), name=model)
        else:
            spec = dict(config=model)
    else:
        spec = copy.deepcopy(dict(model))
    if 'config' not in spec:
        raise KeyError(f'a whole model needs a config: {spec}')
    spec.setdefault('name', osp.splitext(osp.basename(spec['config']))[0])
    for key in ('baseline', 'checkpoint', 'cfg_options', 'deploy_cfg',
                'image'):
        spec.setdefault(key, None)
    return spec


def _without_pretrained(cfg: Any) -> None:
    """No pretrained weights in the model config: timing needs none, and a
    missing file must not stop the benchmark."""
    cfg.model.pop('pretrained', None)
    if 'backbone' in cfg.model:
        cfg.model.backbone.init_cfg = None
        cfg.model.backbone.pop('pretrained', None)


def _has_mask_head(cfg: Any) -> bool:
    roi = cfg.model.get('roi_head') or {}
    return bool(roi.get('mask_head'))


def _noise_image(size: Size, seed: int) -> Any:
    """A seeded uint8 BGR noise image of (H, W)."""
    import numpy as np
    h, w = size
    return np.random.default_rng(seed).integers(
        0, 256, (h, w, 3), dtype=np.uint8)


def _check_summary(report: Any) -> Dict[str, Any]:
    """What the check against PyTorch found, in numbers and words."""
    out: Dict[str, Any] = {}
    for c in report.checks:
        if 'without a counterpart' in c.name:
            out['dets_torch'] = int(c.data['torch'])
            out['dets_backend'] = int(c.data['backend'])
            out['score_thr'] = float(c.data['score_thr'])
        elif 'box max abs diff' in c.name:
            out['box_diff_px'] = c.value
        elif 'score max abs diff' in c.name:
            out['score_diff'] = c.value
        elif 'mask IoU' in c.name:
            out['mask_iou'] = c.value
    words = (f"{out.get('dets_torch', 0)} confident detections "
             f"(score >= {out.get('score_thr', 0):g}), box diff "
             f"{out.get('box_diff_px', 0):.1e} px")
    if 'mask_iou' in out and out.get('dets_torch'):
        words += f", mask IoU >= {out['mask_iou']:.3f}"
    out['check'] = words
    return out


def export_whole(model: WholeSpec,
                 path: str,
                 size: Size = (800, 1344),
                 threads: Optional[int] = None,
                 seed: int = 0,
                 preload: Sequence[str] = ()) -> Dict[str, Any]:
    """Export one whole model with MMDeploy to ``path`` and check it
    against PyTorch (step 1 of the module docstring), in this process.

    Args:
        model: see :func:`whole_spec`.
        path: the ``.onnx`` file to write (its directory must exist).
        size: the input (H, W), the deploy config's static input shape.
        threads: ``torch.set_num_threads`` for the export and PyTorch.
        seed: seeds the weights and the noise image.
        preload: modules imported first.

    Returns:
        dict with ``export_s`` (seconds of the export and the check),
        ``opset``, ``input_shape``, ``deploy_cfg`` (the file's name),
        ``weights`` (``'random'`` or the checkpoint), ``num_params``,
        ``torch_version``, the check's numbers (see :func:`_check_summary`)
        and ``check`` in words; ``error`` instead when the export fails or
        the file disagrees with PyTorch.
    """
    import importlib

    import torch
    for mod in preload:
        importlib.import_module(mod)
    from mmengine.config import Config

    from pola_mm.deployment.mmdeploy_export import require_mmdeploy
    from pola_mm.deployment.mmdeploy_verify import (DeployError,
                                                    deploy_and_verify,
                                                    is_dynamic_hw)

    spec = whole_spec(model)
    h, w = parse_size(size)
    if threads:
        torch.set_num_threads(int(threads))
    cfg = Config.fromfile(resolve_config(spec['config']))
    if spec['cfg_options']:
        cfg.merge_from_dict(spec['cfg_options'])
    _without_pretrained(cfg)
    deploy_file = spec['deploy_cfg'] or stock_deploy_config(
        'instance-seg' if _has_mask_head(cfg) else 'detection')
    deploy = Config.fromfile(deploy_file)
    if is_dynamic_hw(deploy):
        raise ValueError(f'{deploy_file} frees the input size; the '
                         'benchmark times one static size')
    deploy.onnx_config.input_shape = [w, h]  # MMDeploy's (W, H)

    require_mmdeploy()
    from mmdeploy.apis import build_task_processor
    work = osp.dirname(osp.abspath(path))
    checkpoint = spec['checkpoint']
    if checkpoint is None:
        # seeded weights with mmdet's initialisation of the heads, saved so
        # that the export and the PyTorch side load the very same ones
        torch.manual_seed(seed)
        net = build_task_processor(cfg, deploy, 'cpu').build_pytorch_model()
        net.init_weights()
        checkpoint = osp.join(work, 'random_weights.pth')
        torch.save({'state_dict': net.state_dict()}, checkpoint)
        num_params = sum(p.numel() for p in net.parameters())
        del net
        weights = 'random'
    else:
        checkpoint = resolve_config(checkpoint)
        num_params = None
        weights = osp.basename(checkpoint)
    image = spec['image'] or _noise_image((h, w), seed + 1)
    t0 = time.perf_counter()
    try:
        # random weights may have no detection on the noise image: the
        # count is reported (``check``), the file is timed all the same
        report = deploy_and_verify(deploy, cfg, checkpoint, image,
                                   osp.join(work, 'verified'), 'cpu',
                                   require_comparison=False)
    except DeployError as exc:
        return dict(error=f'MMDeploy: {exc}', weights=weights,
                    deploy_cfg=osp.basename(deploy_file))
    export_s = time.perf_counter() - t0
    os.replace(report.onnx_file, path)
    if num_params is None:
        state = torch.load(checkpoint, map_location='cpu')
        state = state.get('state_dict', state)
        num_params = sum(v.numel() for v in state.values()
                         if torch.is_tensor(v))
    return dict(_check_summary(report), export_s=export_s,
                opset=opset_of(path), input_shape=list(
                    report.input_shapes[0]),
                deploy_cfg=osp.basename(deploy_file), weights=weights,
                num_params=num_params, torch_version=torch.__version__)


def run_whole_benchmarks(models: Sequence[WholeSpec],
                         size: Size = (800, 1344),
                         rounds: int = 1,
                         title: Optional[str] = None,
                         runtimes: Sequence[str] = ('onnxruntime', ),
                         threads: Optional[int] = None,
                         **kwargs: Any) -> List[Any]:
    """Export and check every whole model once (:func:`export_whole`) and
    time the files in ``runtimes``, alternating in one process
    (:func:`~pola_mm.analysis.benchmark.onnxrt.measure_exported`, times
    pooled over the rounds).

    Args:
        models: zoo names, config files or dicts (:func:`whole_spec`).
        size: the input (H, W) of every model.
        rounds: how many rounds of timed runs.
        title: the case title of the results (default ``'whole HxW'``).
        runtimes: ``'onnxruntime'`` and/or ``'openvino'``.
        threads: threads of the export, PyTorch and the runtimes.
        **kwargs: passed to :func:`~pola_mm.analysis.benchmark.onnxrt.
            measure_exported` (warmup, repeats, isolate, timeout,
            profile_runs, log).

    Returns:
        list[BenchmarkResult]: one per runtime and model, runtime by
        runtime, with ``exporter='mmdeploy'`` and ``baseline`` the name of
        the model the ratios use.
    """
    hw = parse_size(size)
    specs = {s['name']: s for s in (whole_spec(m) for m in models)}
    title = title or f'whole {size_str(hw)}'
    outs = measure_exported(
        'pola_mm.analysis.benchmark.whole:export_whole',
        {n: dict(model=s, size=list(hw), threads=threads)
         for n, s in specs.items()}, runtimes, rounds=rounds,
        threads=threads, title=title, **kwargs)
    return [BenchmarkResult(
        n, 'infer', hw, 1, 'cpu', 'float32', runtime=rt, title=title,
        exporter='mmdeploy', baseline=s['baseline']).take(
            outs[rt, n], ('export_s', 'opset', 'torch_version', 'num_params',
                          'check', 'deploy_cfg', 'weights', 'ort_profile',
                          VERSION_KEYS[rt]))
        for rt in runtimes for n, s in specs.items()]


def whole_notes(results: Sequence[Any]) -> List[str]:
    """Lines saying how the whole models were exported (one per model, in
    any number of runtimes): deploy config, weights, opset, export and
    check time."""
    whole = {r.name: r for r in results
             if r.exporter == 'mmdeploy'}.values()  # once per model
    if not whole:
        return []
    lines = []
    for r in whole:
        how = (f'{r.name}: MMDeploy torch2onnx with {r.deploy_cfg or "?"} '
               f'at {r.size[0]}x{r.size[1]}, opset {r.opset}, weights '
               + ('random (seeded init_weights; timing only)'
                  if r.weights == 'random' else str(r.weights)))
        if r.export_s is not None:
            how += f', export and check {r.export_s:.0f} s'
        if r.check:
            how += f'; checked against PyTorch: {r.check}'
        lines.append(how)
    return lines
