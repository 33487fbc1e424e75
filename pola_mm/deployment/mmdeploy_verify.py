"""Whole models through MMDeploy, verified against PyTorch.

:func:`deploy_and_verify` is what ``tools/deployment/deploy.py`` runs: it
exports a detector, instance segmenter, segmentor or classifier with
MMDeploy's own ``torch2onnx`` and a deploy config (MMDeploy's stock ONNX
Runtime configs work unchanged once :mod:`pola_mm` is imported, see
:mod:`pola_mm.deployment.mmdeploy_fixes`), builds MMDeploy's ONNX Runtime
backend model from the file, runs it and the PyTorch model on the same
images, and moves the file to ``work_dir`` only when every comparison
passes.

What is compared, per image (MMDeploy task):

- **detection / instance segmentation** (``ObjectDetection``): the final
  detections of both models' ``test_step`` (boxes rescaled to the image,
  scores, labels, masks pasted to the image). Every *confident* detection
  (score >= ``score_thr``) of either side must have a counterpart on the
  other side with the same label, a box within ``box_rtol`` of the image
  scale (its longer side), a score within ``score_atol`` and, with masks, a
  mask IoU >= ``mask_iou``. Detections below ``score_thr`` are not compared
  one to one: MMDeploy's post-processing keeps up to ``pre_top_k`` = 5000
  candidates per image before NMS where mmdet's test_cfg keeps ``nms_pre``,
  so the low-score tails legitimately differ.
- **segmentation** (``Segmentation``): the network output at the network's
  input size. A file with logits (``with_argmax=False``) must be within
  ``logit_rtol`` of PyTorch's ``encode_decode`` logits (relative to their
  largest magnitude); a file with labels (MMDeploy's default
  ``with_argmax=True``) must give PyTorch's argmax everywhere except at
  near-ties, pixels whose two best PyTorch logits are within ``logit_rtol``
  of the logit scale of each other.
- **classification** (``Classification``): ``pred_score`` within
  ``score_atol`` and the same ``pred_label``.

Every image given is checked (at the input size its test pipeline makes).
With a deploy config that frees the height/width (MMDeploy's stock
``*_dynamic.py``), the one file exported on the first image is checked on
every image at its own size.

A deploy config given as ``mmdeploy::<path>`` (``<path>`` relative to
MMDeploy's ``configs/`` folder, e.g.
``mmdeploy::mmdet/detection/detection_onnxruntime_dynamic.py``) is
MMDeploy's stock file from the copy that ships with pola_mm
(:func:`resolve_deploy_config`; the ``mmdeploy`` wheel ships none).
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
from torch import Tensor

__all__ = [
    'DeployError', 'DeployInputError', 'Check', 'DeployReport',
    'MMDEPLOY_SCOPE', 'stock_configs_dir', 'stock_deploy_configs',
    'resolve_deploy_config', 'load_deploy_configs', 'is_dynamic_hw',
    'export_with_mmdeploy', 'compare_on_image', 'deploy_and_verify',
    'draw_results', 'TASKS'
]

#: MMDeploy tasks this module can verify.
TASKS = ('ObjectDetection', 'InstanceSegmentation', 'Segmentation',
         'Classification')

ImageLike = Union[str, np.ndarray]


class DeployError(RuntimeError):
    """A deployment that failed or whose backend disagrees with PyTorch; the
    message says what went wrong."""


class DeployInputError(DeployError):
    """Bad input: a missing file, an unreadable config or override, a
    deploy config this module does not verify."""


@dataclass
class Check:
    """One comparison between the backend and PyTorch on one image."""
    name: str
    value: float
    limit: float
    #: ``'max'``: ``value <= limit`` passes; ``'min'``: ``value >= limit``.
    kind: str = 'max'
    detail: str = ''
    #: numbers behind ``detail`` for programs (e.g. the detection counts).
    data: Dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether the comparison passes (NaN never does)."""
        if self.kind == 'min':
            return bool(self.value >= self.limit)
        return bool(self.value <= self.limit)

    def __str__(self) -> str:
        rel = '<=' if self.kind == 'max' else '>='
        extra = f' ({self.detail})' if self.detail else ''
        return (f'{self.name}: {self.value:.3g} (needs {rel} '
                f'{self.limit:.3g}){extra} {"ok" if self.ok else "FAILED"}')


@dataclass
class DeployReport:
    """What :func:`deploy_and_verify` did."""
    onnx_file: Optional[str]
    task: str
    input_shapes: List[Tuple[int, ...]] = field(default_factory=list)
    checks: List[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every check passed."""
        return bool(self.checks) and all(c.ok for c in self.checks)


#: How a deploy config names one of MMDeploy's stock files shipped with
#: pola_mm: ``mmdeploy::<path relative to MMDeploy's configs/>``.
MMDEPLOY_SCOPE = 'mmdeploy::'


def stock_configs_dir() -> str:
    """The ``configs/`` folder of MMDeploy's stock deploy configs that ship
    with pola_mm (``pola_mm/.mim/mmdeploy_configs``: MMDeploy v1.3.1's files
    byte for byte in MMDeploy's layout, with its LICENSE, README.md for the
    provenance and BLOBS.txt for their git blob ids)."""
    return osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), '.mim',
                    'mmdeploy_configs', 'configs')


def stock_deploy_configs() -> List[str]:
    """The shipped ONNX Runtime deploy configs, as the paths after
    ``mmdeploy::`` (sorted; the ``_base_`` files and backend-less bases are
    left out)."""
    root = stock_configs_dir()
    names = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != '_base_']
        names += [
            osp.relpath(osp.join(folder, f), root).replace(os.sep, '/')
            for f in files if f.endswith('.py') and 'onnxruntime' in f
        ]
    return sorted(names)


def resolve_deploy_config(deploy_cfg: str) -> str:
    """The file of a deploy config: ``mmdeploy::<path>`` is the shipped
    stock file ``<path>`` (:func:`stock_configs_dir`), any other string a
    path, returned as given.

    Raises:
        DeployInputError: a ``mmdeploy::`` name with no shipped file (the
            message lists :func:`stock_deploy_configs`).
    """
    deploy_cfg = str(deploy_cfg)
    if not deploy_cfg.startswith(MMDEPLOY_SCOPE):
        return deploy_cfg
    root = stock_configs_dir()
    rel = deploy_cfg[len(MMDEPLOY_SCOPE):]
    path = osp.normpath(osp.join(root, rel))
    if not (path.startswith(root + os.sep) and osp.isfile(path)):
        names = ', '.join(MMDEPLOY_SCOPE + n for n in stock_deploy_configs())
        raise DeployInputError(f'unknown MMDeploy deploy config {deploy_cfg}'
                               f' (shipped with pola_mm: {names})')
    return path


def load_deploy_configs(deploy_cfg: Union[str, Config],
                        model_cfg: Union[str, Config],
                        cfg_options: Optional[Dict[str, Any]] = None
                        ) -> Tuple[Config, Config]:
    """The deploy and model configs as ``Config`` objects (copies).

    Args:
        deploy_cfg: an MMDeploy deploy config file, ``mmdeploy::<path>``
            (:func:`resolve_deploy_config`) or ``Config``.
        model_cfg: a model config file (mmdet / mmseg / mmpretrain) or
            ``Config``.
        cfg_options: overrides merged into the model config.

    Raises:
        DeployError: a config file does not exist, or the deploy config has
            no ``codebase_config`` / ``onnx_config``.
    """
    cfgs = []
    if not isinstance(deploy_cfg, Config):
        deploy_cfg = resolve_deploy_config(deploy_cfg)
    for what, cfg in (('deploy config', deploy_cfg), ('model config',
                                                      model_cfg)):
        if isinstance(cfg, Config):
            cfgs.append(copy.deepcopy(cfg))
            continue
        if not osp.isfile(str(cfg)):
            raise DeployInputError(f'{what} not found: {cfg}')
        try:
            cfgs.append(Config.fromfile(str(cfg)))
        except Exception as exc:  # syntax errors, missing bases, ...
            raise DeployInputError(f'cannot read {what} {cfg}: '
                                   f'{type(exc).__name__}: {exc}') from exc
    deploy, model = cfgs
    if cfg_options:
        try:
            model.merge_from_dict(cfg_options)
        except Exception as exc:  # e.g. a dict over a string
            raise DeployInputError(f'--cfg-options: {exc}') from exc
    for key in ('codebase_config', 'onnx_config', 'backend_config'):
        if key not in deploy:
            raise DeployInputError(
                f'the deploy config has no {key}: is it an MMDeploy deploy '
                'config (e.g. configs/mmdet/detection/'
                'detection_onnxruntime_static.py)?')
    if deploy.backend_config.get('type') != 'onnxruntime':
        raise DeployInputError(
            'only the ONNX Runtime backend is verified here; the deploy '
            f"config's backend is {deploy.backend_config.get('type')!r}")
    return deploy, model


def is_dynamic_hw(deploy_cfg: Config) -> bool:
    """Whether the deploy config leaves the input's height or width free."""
    axes = deploy_cfg.onnx_config.get('dynamic_axes') or {}
    names = deploy_cfg.onnx_config.get('input_names') or ['input']
    for name in names:
        spec = axes.get(name)
        if spec is None:
            continue
        dims = spec.keys() if isinstance(spec, dict) else spec
        if 2 in dims or 3 in dims:
            return True
    return False


def _task(deploy_cfg: Config) -> str:
    task = deploy_cfg.codebase_config.get('task')
    if task == 'ObjectDetection' and 'masks' in (
            deploy_cfg.onnx_config.get('output_names') or []):
        return 'InstanceSegmentation'
    if task not in TASKS:
        raise DeployError(f'MMDeploy task {task!r} is not verified here; '
                          f'supported: {list(TASKS)}')
    return task


def _quiet_import_mmdeploy() -> None:
    try:
        import mmdeploy  # noqa: F401
    except ImportError as exc:
        raise DeployError(
            'MMDeploy is not installed: pip install -r '
            'requirements/mmdeploy_deps.txt && pip install --no-deps -r '
            'requirements/mmdeploy.txt (see docs/deployment.md)') from exc
    import pola_mm  # noqa: F401  (registers the models, the MMDeploy fixes)


def export_with_mmdeploy(deploy_cfg: Config, model_cfg: Config,
                         checkpoint: Optional[str], img: ImageLike,
                         work_dir: str, device: str = 'cpu') -> str:
    """MMDeploy's ``torch2onnx`` of the model on ``img``.

    Returns:
        The path of the written ``.onnx`` file (in ``work_dir``).

    Raises:
        DeployError: the export failed (its exception quoted).
    """
    _quiet_import_mmdeploy()
    from mmdeploy.apis import torch2onnx
    save_file = deploy_cfg.onnx_config.get('save_file', 'end2end.onnx')
    os.makedirs(work_dir, exist_ok=True)
    try:
        torch2onnx(img, work_dir, save_file, deploy_cfg, model_cfg,
                   checkpoint, device)
    except Exception as exc:  # the exporter and rewriters raise many kinds
        lines = str(exc).strip().splitlines()
        raise DeployError(f'MMDeploy torch2onnx failed: {type(exc).__name__}: '
                          f'{lines[0] if lines else ""}') from exc
    path = osp.join(work_dir, save_file)
    if not osp.isfile(path):
        raise DeployError(f'MMDeploy torch2onnx wrote no {path}')
    return path


def _iou_matrix(a: Tensor, b: Tensor) -> Tensor:
    """Pairwise IoU of ``(N, 4)`` and ``(M, 4)`` xyxy boxes: ``(N, M)``."""
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).clamp(min=0).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).clamp(min=0).prod(-1)
    return inter / (area_a[:, None] + area_b[None, :] - inter).clamp(min=1e-9)


def _mask_iou(a: Tensor, b: Tensor) -> float:
    a, b = a.bool(), b.bool()
    union = (a | b).sum().item()
    if union == 0:
        return 1.0
    return float((a & b).sum().item() / union)


def _match(src: Any, dst: Any, score_thr: float) -> List[Tuple[int, int]]:
    """For each confident detection of ``src``, the ``dst`` detection of the
    same label with the largest box IoU (-1 when ``dst`` has none of the
    label)."""
    pairs = []
    keep = torch.nonzero(src.scores >= score_thr).flatten().tolist()
    for i in keep:
        same = torch.nonzero(dst.labels == src.labels[i]).flatten()
        if same.numel() == 0:
            pairs.append((i, -1))
            continue
        ious = _iou_matrix(src.bboxes[i:i + 1].float(),
                           dst.bboxes[same].float())[0]
        pairs.append((i, int(same[int(ious.argmax())])))
    return pairs


def compare_detections(ref: Any, got: Any, scale: float, score_thr: float,
                       box_rtol: float, score_atol: float,
                       mask_iou: float) -> List[Check]:
    """Compare two ``InstanceData`` of detections (PyTorch ``ref``, backend
    ``got``), both ways; see the module docstring."""
    ref = ref.cpu()
    got = got.cpu()
    worst_box, worst_score, worst_iou = 0.0, 0.0, 1.0
    unmatched = 0
    has_masks = 'masks' in ref and 'masks' in got
    for a, b, forward in ((ref, got, True), (got, ref, False)):
        for i, j in _match(a, b, score_thr):
            if j < 0:
                unmatched += 1
                continue
            box = float((a.bboxes[i].float() - b.bboxes[j].float()).abs()
                        .max())
            if box > box_rtol * scale:
                unmatched += 1
            worst_box = max(worst_box, box)
            worst_score = max(worst_score,
                              float((a.scores[i] - b.scores[j]).abs()))
            if has_masks:
                r, g = (i, j) if forward else (j, i)
                worst_iou = min(worst_iou,
                                _mask_iou(ref.masks[r], got.masks[g]))
    n_ref = int((ref.scores >= score_thr).sum())
    n_got = int((got.scores >= score_thr).sum())
    checks = [
        Check('confident detections without a counterpart', unmatched, 0,
              detail=f'PyTorch {n_ref}, backend {n_got} with score >= '
              f'{score_thr:g}',
              data=dict(torch=n_ref, backend=n_got, score_thr=score_thr)),
        Check('box max abs diff', worst_box, box_rtol * scale,
              detail=f'{box_rtol:g} of the image scale {scale:g}'),
        Check('score max abs diff', worst_score, score_atol),
    ]
    if has_masks:
        checks.append(Check('mask IoU (worst)', worst_iou, mask_iou, 'min'))
    return checks


def _run_ort(path: str, inputs: Tensor) -> np.ndarray:
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    name = sess.get_inputs()[0].name
    return sess.run(None, {name: inputs.detach().cpu().numpy()})[0]


def compare_segmentation(torch_model: Any, path: str, inputs: Tensor,
                         metas: List[dict], logit_rtol: float,
                         with_argmax: bool) -> List[Check]:
    """Compare the ONNX file's output with PyTorch's ``encode_decode`` on
    the same network input; see the module docstring."""
    with torch.no_grad():
        logits = torch_model.encode_decode(inputs, metas).float()
    out = torch.from_numpy(np.asarray(_run_ort(path, inputs)))
    scale = float(logits.abs().max())
    tol = logit_rtol * max(scale, 1e-12)
    if not with_argmax:
        if tuple(out.shape) != tuple(logits.shape):
            return [Check('logits shape matches', 0, 1, 'min',
                          f'{tuple(out.shape)} vs {tuple(logits.shape)}')]
        diff = float((out.float() - logits).abs().max())
        return [Check('logit max abs diff', diff, tol,
                      detail=f'{logit_rtol:g} of the logit scale '
                      f'{scale:.3g}')]
    labels = logits.argmax(1, keepdim=True)
    out = out.reshape(labels.shape).long()
    differ = out != labels
    top2 = logits.topk(2, dim=1).values if logits.shape[1] > 1 else None
    near_tie = torch.zeros_like(differ)
    if top2 is not None:
        near_tie = ((top2[:, :1] - top2[:, 1:2]) <= tol)
    not_tie = int((differ & ~near_tie).sum())
    return [
        Check('pixels whose label differs (not near-ties)', not_tie, 0,
              detail=f'{int(differ.sum())} of {differ.numel()} differ in '
              f'all; near-tie margin {tol:.3g}')
    ]


def compare_classification(ref: Any, got: Any,
                           score_atol: float) -> List[Check]:
    """Compare ``pred_score`` / ``pred_label`` of two classification data
    samples."""
    a = ref.pred_score.float().cpu()
    b = got.pred_score.float().cpu()
    return [
        Check('class score max abs diff', float((a - b).abs().max()),
              score_atol),
        Check('same predicted label', float(int(ref.pred_label.item() ==
                                                got.pred_label.item())),
              1.0, 'min')
    ]


def compare_on_image(task_processor: Any, torch_model: Any,
                     backend_model: Any, path: str, img: ImageLike,
                     deploy_cfg: Config, task: str, score_thr: float = 0.3,
                     box_rtol: float = 1e-3, score_atol: float = 1e-4,
                     mask_iou: float = 0.99, logit_rtol: float = 1e-4
                     ) -> Tuple[Tuple[int, ...], List[Check]]:
    """Run PyTorch and the backend on one image and compare.

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
    with torch.no_grad():
        ref = torch_model.test_step(copy.deepcopy(raw))[0]
        got = backend_model.test_step(copy.deepcopy(raw))[0]
    if task == 'Classification':
        return shape, compare_classification(ref, got, score_atol)
    h, w = ref.metainfo['ori_shape'][:2]
    return shape, compare_detections(ref.pred_instances, got.pred_instances,
                                     float(max(h, w)), score_thr, box_rtol,
                                     score_atol, mask_iou)


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
                      logit_rtol: float = 1e-4) -> DeployReport:
    """Export with MMDeploy on the first image, compare the ONNX Runtime
    backend with PyTorch on every image, and keep the file only if all
    comparisons pass.

    Args:
        deploy_cfg: an MMDeploy ONNX Runtime deploy config (file,
            ``mmdeploy::<path>`` or Config).
        model_cfg: the model config (file or Config).
        checkpoint: the model's weights (None: its initialisation, without
            ``init_cfg`` weights).
        imgs: an image (path or BGR array) or several; the export uses the
            first one.
        work_dir: where the verified file is written.
        device: ``'cpu'`` (the PyTorch model and ONNX Runtime's provider).
        cfg_options: overrides merged into the model config.
        score_thr, box_rtol, score_atol, mask_iou, logit_rtol: the
            tolerances (see the module docstring).

    Returns:
        The report; ``report.onnx_file`` is the written file.

    Raises:
        DeployError: bad configs, a failed export, or a disagreement (the
            message lists every check; no file is left in ``work_dir``).
    """
    deploy_cfg, model_cfg = load_deploy_configs(deploy_cfg, model_cfg,
                                                cfg_options)
    task = _task(deploy_cfg)
    if isinstance(imgs, (str, np.ndarray)):
        imgs = [imgs]
    imgs = list(imgs)
    if not imgs:
        raise DeployError('no image to export and compare on')
    for img in imgs:
        if isinstance(img, str) and not osp.isfile(img):
            raise DeployInputError(f'image not found: {img}')
    if checkpoint is not None and not osp.isfile(checkpoint):
        raise DeployInputError(f'checkpoint not found: {checkpoint}')
    _quiet_import_mmdeploy()
    from mmdeploy.apis import build_task_processor

    os.makedirs(work_dir, exist_ok=True)
    tmp_dir = tempfile.mkdtemp(prefix='.unverified-', dir=work_dir)
    try:
        task_processor = build_task_processor(model_cfg, deploy_cfg, device)
        torch_model = task_processor.build_pytorch_model(checkpoint)
        if checkpoint is None:
            # torch2onnx builds its own model: give it these very weights
            checkpoint = osp.join(tmp_dir, 'initial_weights.pth')
            torch.save({'state_dict': torch_model.state_dict()}, checkpoint)
        path = export_with_mmdeploy(deploy_cfg, model_cfg, checkpoint,
                                    imgs[0], tmp_dir, device)
        backend_model = None
        if task != 'Segmentation':
            backend_model = task_processor.build_backend_model(
                [path], task_processor.update_data_preprocessor)
        report = DeployReport(None, task)
        for k, img in enumerate(imgs):
            shape, checks = compare_on_image(
                task_processor, torch_model, backend_model, path, img,
                deploy_cfg, task, score_thr, box_rtol, score_atol, mask_iou,
                logit_rtol)
            report.input_shapes.append(shape)
            for c in checks:
                c.name = f'image {k} {shape[2]}x{shape[3]}: {c.name}'
            report.checks.extend(checks)
        for c in report.checks:
            print_log(str(c), logger='current')
        if not report.ok:
            raise DeployError(
                'the ONNX Runtime model differs from PyTorch, so no file was '
                'written:\n  ' + '\n  '.join(str(c) for c in report.checks))
        final = osp.join(work_dir, osp.basename(path))
        os.replace(path, final)
        report.onnx_file = final
        return report
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def draw_results(deploy_cfg: Union[str, Config],
                 model_cfg: Union[str, Config],
                 checkpoint: Optional[str],
                 onnx_file: str,
                 img: ImageLike,
                 out_dir: str,
                 device: str = 'cpu',
                 cfg_options: Optional[Dict[str, Any]] = None) -> List[str]:
    """Draw PyTorch's and the ONNX Runtime model's results on ``img`` with
    MMDeploy's ``visualize_model`` (files, no window).

    Returns:
        The image files written in ``out_dir`` (PyTorch's only with a
        ``checkpoint``: a new initialisation would draw another model).
    """
    deploy_cfg, model_cfg = load_deploy_configs(deploy_cfg, model_cfg,
                                                cfg_options)
    _quiet_import_mmdeploy()
    from mmdeploy.apis import visualize_model
    from mmdeploy.utils import Backend
    files = []
    runs = [(Backend.ONNXRUNTIME, [onnx_file], 'output_onnxruntime.jpg')]
    if checkpoint is not None:  # without weights PyTorch's would differ
        runs.insert(0, (Backend.PYTORCH, checkpoint, 'output_pytorch.jpg'))
    for backend, model, name in runs:
        out = osp.join(out_dir, name)
        visualize_model(model_cfg, deploy_cfg, model, img, device,
                        backend=backend, output_file=out, show_result=False)
        files.append(out)
    return files
