"""Whole models through MMDeploy, verified against PyTorch.

:func:`deploy_and_verify` is what ``tools/deployment/deploy.py`` runs: it
exports a detector, instance segmenter, segmentor or classifier with
MMDeploy's own ``torch2onnx`` and a deploy config (MMDeploy's stock ONNX
Runtime configs work unchanged once :mod:`pola_mm` is imported, see
:mod:`pola_mm.deployment.mmdeploy_fixes`), builds MMDeploy's ONNX Runtime
backend model from the file, runs it and the PyTorch model on the same
images, and moves the file to ``work_dir`` only when every comparison
passes.

The comparisons, and their tolerances, are
:mod:`pola_mm.deployment.mmdeploy_compare`'s; the deploy configs and the
export :mod:`pola_mm.deployment.mmdeploy_export`'s; drawing the results
:mod:`pola_mm.deployment.mmdeploy_draw`'s. Their public names are importable
from here too.

Every image given is checked (at the input size its test pipeline makes).
With a deploy config that frees the height/width (MMDeploy's stock
``*_dynamic.py``), the one file exported on the first image is checked on
every image at its own size. Detectors are compared on at least their
``top_k`` best detections per image, whatever their scores; a check that
compared no detection at all is refused (:class:`NothingComparedError`),
never reported as verified.

Detectors' boxes are clipped to the network input on both sides. The
exported graph knows only its input tensor: MMDeploy's detector rewrites
set ``img_shape`` from its size, the resized image padded by the data
preprocessor (960x800 for a 938x800 image padded to 32), and the RPN's
proposals and the final boxes are clipped to that, where mmdet's own test
clips to the resized image. PyTorch is run with the same ``img_shape``
(:func:`in_input_frame`), and the check's line names both sizes where they
differ; mmdet's own results can differ from the deployed model's for boxes
that reach into the padding (bottom and right, less than the pad divisor).
:func:`verify_onnx_file` runs the same comparison on a file exported
before.

Without a checkpoint the model is built with seeded random weights (the
same ``seed``, the same weights and file), which the export is handed so
that both sides are one model; ``save_weights`` keeps them next to the
file.
"""
import copy
import os
import os.path as osp
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from mmengine.config import Config
from mmengine.logging import print_log

from .mmdeploy_compare import (DEFAULT_TOP_K, Check, compare_classification,
                               compare_detections, compare_segmentation)
from .mmdeploy_draw import draw_results
from .mmdeploy_export import (MMDEPLOY_SCOPE, TASKS, DeployError,
                              DeployInputError, ImageLike, deploy_task,
                              export_with_mmdeploy, is_dynamic_hw,
                              load_deploy_configs, require_mmdeploy,
                              resolve_deploy_config, roi_align_advice,
                              stock_configs_dir, stock_deploy_configs)

__all__ = [
    'DeployError', 'DeployInputError', 'NothingComparedError', 'Check',
    'DeployReport', 'DEFAULT_TOP_K',
    'MMDEPLOY_SCOPE', 'stock_configs_dir', 'stock_deploy_configs',
    'resolve_deploy_config', 'load_deploy_configs', 'is_dynamic_hw',
    'export_with_mmdeploy', 'compare_detections', 'compare_segmentation',
    'compare_classification', 'compare_on_image', 'in_input_frame',
    'deploy_and_verify', 'verify_onnx_file',
    'draw_results', 'TASKS'
]


class NothingComparedError(DeployError):
    """A detector's check that compared no detection on any image: it could
    not have failed, so it verifies nothing."""


#: The tasks whose checks compare detections.
DETECTION_TASKS = ('ObjectDetection', 'InstanceSegmentation')


@dataclass
class DeployReport:
    """What :func:`deploy_and_verify` did."""
    onnx_file: Optional[str]
    task: str
    input_shapes: List[Tuple[int, ...]] = field(default_factory=list)
    checks: List[Check] = field(default_factory=list)
    #: the seed of the random weights; None when a checkpoint was given
    seed: Optional[int] = None
    #: the random weights kept next to the file (``save_weights``)
    weights_file: Optional[str] = None

    @property
    def ok(self) -> bool:
        """Every check passed."""
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def detections_compared(self) -> Tuple[int, int]:
        """PyTorch's and the backend's detections compared, summed over the
        images ((0, 0) for tasks without detections)."""
        counts = [c.data for c in self.checks
                  if 'compared_torch' in c.data]
        return (int(sum(d['compared_torch'] for d in counts)),
                int(sum(d['compared_backend'] for d in counts)))


def compare_on_image(task_processor: Any, torch_model: Any,
                     backend_model: Any, path: str, img: ImageLike,
                     deploy_cfg: Config, task: str, score_thr: float = 0.3,
                     box_rtol: float = 1e-3, score_atol: float = 1e-4,
                     mask_iou: float = 0.99, logit_rtol: float = 1e-4,
                     top_k: int = DEFAULT_TOP_K
                     ) -> Tuple[Tuple[int, ...], List[Check]]:
    """Run PyTorch and the backend on one image and compare (detections:
    every one with score >= ``score_thr`` and at least the ``top_k`` best
    of each side).

    Returns:
        The network input shape and the checks.
    """
    from mmdeploy.utils import get_input_shape
    input_shape = get_input_shape(deploy_cfg)
    data, inputs = task_processor.create_input(
        img, input_shape,
        data_preprocessor=getattr(torch_model, 'data_preprocessor', None))
    shape = tuple(int(s) for s in inputs.shape)
    if task == 'Segmentation':
        metas = [s.metainfo for s in data['data_samples']]
        with_argmax = deploy_cfg.codebase_config.get('with_argmax', True)
        return shape, compare_segmentation(torch_model, path, inputs, metas,
                                           logit_rtol, with_argmax)
    raw, _ = task_processor.create_input(img, input_shape)
    framed = raw
    if task != 'Classification':
        framed, padded_from = in_input_frame(raw, shape[2:])
    with torch.no_grad():
        ref = torch_model.test_step(copy.deepcopy(framed))[0]
        got = backend_model.test_step(copy.deepcopy(raw))[0]
    if task == 'Classification':
        return shape, compare_classification(ref, got, score_atol)
    h, w = ref.metainfo['ori_shape'][:2]
    soft = None
    if 'masks' in ref.pred_instances:
        soft = soft_masks(torch_model, framed)
    checks = compare_detections(ref.pred_instances, got.pred_instances,
                                float(max(h, w)), score_thr, box_rtol,
                                score_atol, mask_iou,
                                *detections_post_processing(torch_model),
                                soft_masks=soft, top_k=top_k)
    if padded_from is not None:
        checks[0].detail += (
            f'; boxes clipped to the padded input {shape[2]}x{shape[3]} '
            'on both sides, as in the exported graph (the resized image: '
            f'{padded_from[0]}x{padded_from[1]})')
    return shape, checks


def in_input_frame(raw: Dict[str, Any], hw: Sequence[int]
                   ) -> Tuple[Dict[str, Any], Optional[Tuple[int, int]]]:
    """The data of one image as MMDeploy's exported detector sees it: its
    ``img_shape``, within which boxes and proposals are clipped, is the
    network input's size ``hw`` (MMDeploy's detector rewrites set it from
    the input tensor, the resized image padded by the data preprocessor),
    where mmdet's own test clips to the resized image.

    Returns:
        ``raw`` with that ``img_shape`` (a copy; ``raw`` itself where the
        image fills the input) and the resized image's ``(h, w)`` where it
        was padded (None where not).
    """
    hw = tuple(int(v) for v in hw)
    samples = raw.get('data_samples') or []
    sizes = {tuple(int(v) for v in s.metainfo.get('img_shape', hw)[:2])
             for s in samples}
    if not sizes or sizes == {hw}:
        return raw, None
    framed = copy.copy(raw)
    framed['data_samples'] = [copy.deepcopy(s) for s in samples]
    for sample in framed['data_samples']:
        sample.set_metainfo(dict(img_shape=hw))
    return framed, min(sizes)


def soft_masks(model: Any, raw: Any) -> Optional[torch.Tensor]:
    """PyTorch's masks before binarisation (0-255, mmdet's soft masks with
    ``mask_thr_binary < 0``) for the same detections; None where the model
    has no such setting."""
    cfgs = [m.test_cfg for m in model.modules()
            if hasattr(m, 'test_cfg') and hasattr(m.test_cfg, 'get')
            and m.test_cfg.get('mask_thr_binary') is not None]
    if not cfgs:
        return None
    thresholds = [c['mask_thr_binary'] for c in cfgs]
    try:
        for c in cfgs:
            c['mask_thr_binary'] = -1
        with torch.no_grad():
            out = model.test_step(copy.deepcopy(raw))[0]
    finally:
        for c, t in zip(cfgs, thresholds):
            c['mask_thr_binary'] = t
    masks = out.pred_instances.get('masks')
    return None if masks is None else masks.cpu()


def detections_post_processing(model: Any) -> Tuple[Optional[int], float]:
    """A detector's final post-processing from its test_cfg (two-stage:
    ``rcnn``'s): the per-image cap ``max_per_img`` (None where it has none)
    and NMS's IoU threshold (0.5 where it names none)."""
    cfg = getattr(model, 'test_cfg', None) or {}
    if hasattr(cfg, 'get') and cfg.get('rcnn') is not None:
        cfg = cfg['rcnn']
    if not hasattr(cfg, 'get'):
        return None, 0.5
    cap = cfg.get('max_per_img')
    nms = cfg.get('nms') or {}
    iou = nms.get('iou_threshold', 0.5) if hasattr(nms, 'get') else 0.5
    return (None if cap is None else int(cap)), float(iou)


def _images_of(imgs: Union[ImageLike, Sequence[ImageLike]]
               ) -> List[ImageLike]:
    """The images as a list, each path checked.

    Raises:
        DeployError: no image; DeployInputError: a path that is no file.
    """
    if isinstance(imgs, (str, np.ndarray)):
        imgs = [imgs]
    imgs = list(imgs)
    if not imgs:
        raise DeployError('no image to export and compare on')
    for img in imgs:
        if isinstance(img, str) and not osp.isfile(img):
            raise DeployInputError(f'image not found: {img}')
    return imgs


def _build_torch_model(task_processor: Any, checkpoint: Optional[str],
                       seed: Optional[int]) -> Any:
    """PyTorch's model: ``checkpoint``'s weights, or without one the
    initialisation drawn from ``seed`` (None: from torch's current random
    state), which leaves the caller's random state as it was."""
    if checkpoint is not None or seed is None:
        return task_processor.build_pytorch_model(checkpoint)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return task_processor.build_pytorch_model(None)


def _nothing_compared(report: DeployReport, top_k: int,
                      score_thr: float) -> str:
    """The message of a detector's check that compared no detection."""
    return (f'nothing to compare: neither PyTorch nor ONNX Runtime has a '
            f'detection on the {len(report.input_shapes)} image(s) '
            f'(compared would be every one with score >= {score_thr:g} and '
            f'the top {top_k}), so the file is not verified and was not '
            "written; use an image with objects in it, trained weights, or "
            "a lower threshold in the model's test_cfg (score_thr) and the "
            "deploy config's codebase_config.post_processing.score_threshold")


def _refusal(report: DeployReport, advice: Optional[str]) -> str:
    """The message of a check that failed: every check, and the advice of
    :func:`~pola_mm.deployment.mmdeploy_export.roi_align_advice`."""
    msg = ('the ONNX Runtime model differs from PyTorch, so no file was '
           'written:\n  ' + '\n  '.join(str(c) for c in report.checks))
    return msg + (f'\nnote: {advice}' if advice else '')


def _keep_weights(weights: str, onnx_file: str) -> str:
    """Move the random weights ``weights`` next to ``onnx_file``, named
    after it (``end2end.onnx`` -> ``end2end.pth``); returns that path."""
    final = osp.splitext(onnx_file)[0] + '.pth'
    os.replace(weights, final)
    return final


def _compare_images(report: DeployReport, task_processor: Any,
                    torch_model: Any, path: str, imgs: List[ImageLike],
                    deploy_cfg: Config, score_thr: float, box_rtol: float,
                    score_atol: float, mask_iou: float, logit_rtol: float,
                    top_k: int) -> None:
    """Run the file ``path`` in MMDeploy's ONNX Runtime backend model and
    ``torch_model`` on each image and add the input shapes and the checks
    (named ``image K HxW: ...``) to ``report``."""
    task = report.task
    backend_model = None
    if task != 'Segmentation':
        backend_model = task_processor.build_backend_model(
            [path], task_processor.update_data_preprocessor)
    for k, img in enumerate(imgs):
        shape, checks = compare_on_image(
            task_processor, torch_model, backend_model, path, img,
            deploy_cfg, task, score_thr, box_rtol, score_atol, mask_iou,
            logit_rtol, top_k)
        report.input_shapes.append(shape)
        for c in checks:
            c.name = f'image {k} {shape[2]}x{shape[3]}: {c.name}'
        report.checks.extend(checks)


def verify_onnx_file(deploy_cfg: Union[str, Config],
                     model_cfg: Union[str, Config],
                     checkpoint: Optional[str], onnx_file: str,
                     imgs: Union[ImageLike, Sequence[ImageLike]],
                     device: str = 'cpu',
                     cfg_options: Optional[Dict[str, Any]] = None,
                     score_thr: float = 0.3, box_rtol: float = 1e-3,
                     score_atol: float = 1e-4, mask_iou: float = 0.99,
                     logit_rtol: float = 1e-4, top_k: int = DEFAULT_TOP_K,
                     seed: Optional[int] = 0) -> DeployReport:
    """Compare an ONNX file that MMDeploy exported (``end2end.onnx``) with
    PyTorch on every image, as :func:`deploy_and_verify` compares the file
    it exports, without exporting or moving anything.

    Args: as :func:`deploy_and_verify`; ``checkpoint`` the weights the file
    was exported from (None: the initialisation drawn from ``seed``).

    Returns:
        The report (``report.ok``: every check passed; ``onnx_file`` the
        file given). Nothing is raised for a disagreement.

    Raises:
        DeployError: bad configs or inputs.
    """
    deploy_cfg, model_cfg = load_deploy_configs(deploy_cfg, model_cfg,
                                                cfg_options)
    imgs = _images_of(imgs)
    for path, what in ((onnx_file, 'ONNX file'), (checkpoint, 'checkpoint')):
        if path is not None and not osp.isfile(path):
            raise DeployInputError(f'{what} not found: {path}')
    require_mmdeploy()
    from mmdeploy.apis import build_task_processor
    report = DeployReport(onnx_file, deploy_task(deploy_cfg),
                          seed=None if checkpoint is not None else seed)
    task_processor = build_task_processor(model_cfg, deploy_cfg, device)
    torch_model = _build_torch_model(task_processor, checkpoint, seed)
    _compare_images(report, task_processor, torch_model, onnx_file, imgs,
                    deploy_cfg, score_thr, box_rtol, score_atol, mask_iou,
                    logit_rtol, top_k)
    return report


def deploy_and_verify(deploy_cfg: Union[str, Config],
                      model_cfg: Union[str, Config],
                      checkpoint: Optional[str],
                      imgs: Union[ImageLike, Sequence[ImageLike]],
                      work_dir: str,
                      device: str = 'cpu',
                      cfg_options: Optional[Dict[str, Any]] = None,
                      score_thr: float = 0.3,
                      box_rtol: float = 1e-3,
                      score_atol: float = 1e-4,
                      mask_iou: float = 0.99,
                      logit_rtol: float = 1e-4,
                      top_k: int = DEFAULT_TOP_K,
                      seed: Optional[int] = 0,
                      save_weights: bool = False,
                      require_comparison: bool = True) -> DeployReport:
    """Export with MMDeploy on the first image, compare the ONNX Runtime
    backend with PyTorch on every image, and keep the file only if all
    comparisons pass.

    Args:
        deploy_cfg: an MMDeploy ONNX Runtime deploy config (file,
            ``mmdeploy::<path>``, ``pola_mm_deploy::<path>`` or Config).
        model_cfg: the model config (file or Config).
        checkpoint: the model's weights (None: its initialisation, without
            ``init_cfg`` weights, drawn from ``seed``).
        imgs: an image (path or BGR array) or several; the export uses the
            first one.
        work_dir: where the verified file is written.
        device: ``'cpu'`` (the PyTorch model and ONNX Runtime's provider).
        cfg_options: overrides merged into the model config.
        score_thr, box_rtol, score_atol, mask_iou, logit_rtol: the
            tolerances (see :mod:`~pola_mm.deployment.mmdeploy_compare`).
        top_k: detections compared per image and side at least, whatever
            their scores (besides every one with score >= ``score_thr``).
        seed: seeds the random weights without a checkpoint (None: torch's
            current random state).
        save_weights: without a checkpoint, keep the random weights next to
            the verified file (``end2end.pth``, ``{'state_dict': ...}``:
            a checkpoint for this tool and mmdet's / mmseg's).
        require_comparison: refuse a detector's check that compared no
            detection on any image (:class:`NothingComparedError`); only a
            caller that reports the count itself (the whole-model
            benchmark, which times random weights) turns this off.

    Returns:
        The report; ``report.onnx_file`` is the written file.

    Raises:
        DeployError: bad configs, a failed export, a disagreement (the
            message lists every check; no file is left in ``work_dir``),
            or nothing compared (:class:`NothingComparedError`).
    """
    deploy_cfg, model_cfg = load_deploy_configs(deploy_cfg, model_cfg,
                                                cfg_options)
    task = deploy_task(deploy_cfg)
    imgs = _images_of(imgs)
    if checkpoint is not None and not osp.isfile(checkpoint):
        raise DeployInputError(f'checkpoint not found: {checkpoint}')
    require_mmdeploy()
    from mmdeploy.apis import build_task_processor

    os.makedirs(work_dir, exist_ok=True)
    tmp_dir = tempfile.mkdtemp(prefix='.unverified-', dir=work_dir)
    report = DeployReport(None, task,
                          seed=None if checkpoint is not None else seed)
    try:
        task_processor = build_task_processor(model_cfg, deploy_cfg, device)
        torch_model = _build_torch_model(task_processor, checkpoint, seed)
        weights = checkpoint
        if checkpoint is None:
            # torch2onnx builds its own model: give it these very weights
            weights = osp.join(tmp_dir, 'initial_weights.pth')
            torch.save({'state_dict': torch_model.state_dict()}, weights)
        path = export_with_mmdeploy(deploy_cfg, model_cfg, weights,
                                    imgs[0], tmp_dir, device)
        _compare_images(report, task_processor, torch_model, path, imgs,
                        deploy_cfg, score_thr, box_rtol, score_atol,
                        mask_iou, logit_rtol, top_k)
        for c in report.checks:
            print_log(str(c), logger='current')
        if not report.ok:
            raise DeployError(_refusal(
                report, roi_align_advice(deploy_cfg, model_cfg)))
        if (require_comparison and task in DETECTION_TASKS
                and not sum(report.detections_compared)):
            raise NothingComparedError(
                _nothing_compared(report, top_k, score_thr))
        final = osp.join(work_dir, osp.basename(path))
        os.replace(path, final)
        report.onnx_file = final
        if save_weights and checkpoint is None:
            report.weights_file = _keep_weights(weights, final)
        return report
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
