"""Narrow fixes that let MMDeploy 1.3.1 export on torch >= 2.9.

MMDeploy 1.3.1 (December 2023) was written for torch 1.x / 2.0. On the torch
pola_mm installs (2.14) its ``torch2onnx`` fails for every model, mmdet's own
included, for two reasons, both fixed here and nowhere else:

1. **The default exporter.** ``torch.onnx.export`` uses the ``torch.export``
   based exporter by default since torch 2.9 (``dynamo=True``). MMDeploy's
   rewriters patch functions and symbolics for the TorchScript tracer, and
   its ``export`` calls ``torch.onnx.export`` without ``dynamo=``, so the
   export fails ("Failed to export the model with torch.export"). A function
   rewriter for ``torch.onnx.export``, registered in MMDeploy's own
   ``FUNCTION_REWRITER``, adds ``dynamo=False`` unless the caller chose.
   MMDeploy applies its rewriters only inside its ``RewriterContext``, that
   is, while its ``export`` runs: ``torch.onnx.export`` everywhere else
   (pola_mm's own ``tools/deployment/pytorch2onnx.py`` included) keeps
   torch's default. The same rewriter refuses a pola_mm backbone with a
   dynamic input height/width (:class:`DynamicSizeError`): their traced
   graphs hold the input size as constants, so such a file would be wrong
   at every other size (MMDeploy's stock ``*_dynamic.py`` configs free
   both; dynamic shapes for other models are untouched).

2. **Removed symbolic helpers.** MMDeploy's ``RoIAlign`` symbolic (every
   two-stage detector: Mask R-CNN, Cascade) imports
   ``torch.onnx.symbolic_opset9._cast_Long``, which torch removed (the
   ``torch.onnx.symbolic_opset*`` modules are now thin re-exports of
   ``torch.onnx._internal.torchscript_exporter``). It is provided again as
   the same one-line symbolic torch had (``Cast`` to INT64). Two more names
   MMDeploy rewrites for other backends (``symbolic_opset11.
   _prepare_onnx_paddings`` for TensorRT, ``symbolic_opset9._generic_rnn``
   for ncnn) are still in torch's internal modules and are re-exported from
   there. Only missing names are added; nothing of torch is replaced.

3. **Inexact adaptive pooling** (not a torch 2.14 matter, but it decides
   whether UperNet verifies): MMDeploy replaces ``adaptive_avg_pool2d`` by
   ``avg_pool2d`` with kernel ``floor(size / out)`` for every backend but
   ncnn and TorchScript, which equals adaptive pooling only where the map
   is divisible by the output size (UperNet's pyramid pooling at 512x512:
   the 16x16 map pooled to 3x3 and 6x6 is not). For the ONNX Runtime
   backend, a rewriter registered for that backend (MMDeploy prefers it to
   its default one) computes adaptive pooling exactly at static sizes: a
   product with constant averaging matrices, ``P_h x P_w^T``, whose rows
   average PyTorch's bins ``[floor(i H / h), ceil((i + 1) H / h))``; where
   the map is divisible it keeps MMDeploy's ``avg_pool2d``, and with dynamic
   shapes MMDeploy's rule. mmseg's own UperNet gets the same, exact, file.

4. **Cross-level RPN NMS** (again not a torch matter; it decides whether
   two-stage detectors verify): MMDeploy's ``RPNHead.predict_by_feat``
   rewrite runs one NMS over the proposals of all levels, with the deploy
   config's score threshold (0.05), where mmdet runs a level-wise NMS
   (``batched_nms`` by level) without one and drops empty boxes first. The
   proposals, and then every detection of Mask R-CNN and Cascade, differ
   from mmdet's. For the ONNX Runtime backend a rewriter computes mmdet's
   rule in the graph: per level the ``nms_pre`` best, decoded and clipped;
   empty boxes scored 0; one ONNX ``NonMaxSuppression`` over boxes offset
   by ``level * (max coordinate + 1)`` (mmdet's own ``batched_nms`` trick,
   so boxes of different levels never overlap), the ``max_per_img`` best
   kept and the offsets taken off again. Likewise MMDeploy's
   ``BBoxHead.predict_by_feat`` keeps, for every class, the box of each
   RoI's best class, where mmdet decodes each class's own box
   (``reg_class_agnostic=False``, Mask R-CNN's default); its ONNX Runtime
   rewriter here runs the same grouped NMS over every (RoI, class) pair
   with its own box, as mmdet's ``multiclass_nms``.

All are applied when MMDeploy is imported (an import hook waits for
``mmdeploy.core``; nothing of MMDeploy is imported by ``import pola_mm``),
or at once if it already was. Nothing here runs the models: what mmdet's,
mmseg's and pola_mm's models compute is unchanged (the export runs their
code as MMDeploy patches it).
"""
import importlib.abc
import importlib.machinery
import inspect
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from mmengine.logging import print_log

__all__ = [
    'DynamicSizeError', 'fixed_size_backbones', 'refuse_dynamic_hw',
    'needs_torchscript_exporter', 'provide_removed_symbolics',
    'register_mmdeploy_rewriters', 'install_mmdeploy_fixes', 'applied',
    'adaptive_pool_matrix'
]

#: What has been applied: ``'symbolics'`` (the names added to torch's
#: modules) and ``'rewriters'`` (True once the export rewriter is
#: registered).
applied: Dict[str, Any] = {'symbolics': [], 'rewriters': False}

_lock = threading.Lock()


def needs_torchscript_exporter() -> bool:
    """True when ``torch.onnx.export`` defaults to the ``torch.export``
    based exporter (torch >= 2.9: ``dynamo=True`` by default)."""
    try:
        param = inspect.signature(torch.onnx.export).parameters.get('dynamo')
    except (TypeError, ValueError):  # not introspectable
        return False
    return param is not None and param.default is True


def _cast_long(g: Any, input: Any, non_blocking: Any = False) -> Any:
    """The symbolic ``torch.onnx.symbolic_opset9._cast_Long`` had: an ONNX
    ``Cast`` of ``input`` to INT64 (``non_blocking`` is ignored, as it was).

    Args:
        g: the TorchScript ONNX graph context.
        input: the value to cast.
        non_blocking: unused (kept for the old signature).

    Returns:
        The ``Cast`` node's output.
    """
    return g.op('Cast', input, to_i=torch._C._onnx.TensorProtoDataType.INT64)


def provide_removed_symbolics() -> List[str]:
    """Add the symbolic helpers MMDeploy imports that torch removed from
    ``torch.onnx.symbolic_opset9`` / ``symbolic_opset11``.

    Only names that are missing are added (idempotent); on a torch that
    still has them nothing changes.

    Returns:
        The ``module.name`` entries added by this call.
    """
    import importlib
    internal = 'torch.onnx._internal.torchscript_exporter.'
    wanted = [
        ('torch.onnx.symbolic_opset9', '_cast_Long', lambda: _cast_long),
        ('torch.onnx.symbolic_opset9', '_generic_rnn',
         lambda: importlib.import_module(internal +
                                         'symbolic_opset9')._generic_rnn),
        ('torch.onnx.symbolic_opset11', '_prepare_onnx_paddings',
         lambda: importlib.import_module(internal + 'symbolic_opset11').
         _prepare_onnx_paddings),
    ]
    added = []
    for module_name, name, get in wanted:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, name):
            continue
        try:
            value = get()
        except (ImportError, AttributeError):
            continue  # not in this torch either: nothing to re-export
        setattr(module, name, value)
        added.append(f'{module_name}.{name}')
    applied['symbolics'].extend(added)
    return added


class DynamicSizeError(RuntimeError):
    """A pola_mm backbone asked to export with a free input height/width."""


def fixed_size_backbones(model: torch.nn.Module) -> List[str]:
    """Class names of the pola_mm backbones in ``model``.

    Their traced graphs hold the input size as constants (position tables
    resized to the stage maps, padding to patch and window sizes, Swin's
    windows and shifted-window masks), so a file exported with a free height
    or width would compute something else at other sizes.
    """
    names = []
    for module in model.modules():
        cls = type(module)
        if cls.__module__.startswith('pola_mm.models.backbones') and \
                cls.__name__ not in names and hasattr(module, 'out_indices'):
            names.append(cls.__name__)
    return names


def dynamic_hw_axes(dynamic_axes: Any, input_names: Any) -> bool:
    """Whether ``dynamic_axes`` (``torch.onnx.export``'s) frees axis 2 or 3
    of the first input."""
    if not dynamic_axes:
        return False
    first = (list(input_names) or ['input'])[0] if input_names else 'input'
    spec = dynamic_axes.get(first)
    if spec is None:
        return False
    dims = spec.keys() if isinstance(spec, dict) else spec
    return 2 in dims or 3 in dims


def refuse_dynamic_hw(model: torch.nn.Module, dynamic_axes: Any,
                      input_names: Any) -> None:
    """Raise :class:`DynamicSizeError` when ``model`` has a pola_mm backbone
    and the export would free the input's height or width."""
    found = fixed_size_backbones(model)
    if found and dynamic_hw_axes(dynamic_axes, input_names):
        raise DynamicSizeError(
            f'{", ".join(found)} exports at a fixed input size (position '
            'tables, padding and windows are constants of the traced graph), '
            'so a file with a dynamic height/width would be wrong at other '
            'sizes; use a static deploy config (e.g. '
            'detection_onnxruntime_static.py, instance-seg_onnxruntime_'
            'static.py, segmentation_onnxruntime_static-512x512.py, '
            'classification_onnxruntime_static.py), one file per input size')


def _onnx_export__torchscript(*args: Any, **kwargs: Any) -> Any:
    """MMDeploy function rewriter of ``torch.onnx.export``: the TorchScript
    exporter (``dynamo=False``) unless the caller passed ``dynamo``.

    Active only inside MMDeploy's ``RewriterContext`` (its ``export``).
    Refuses (:class:`DynamicSizeError`) a pola_mm backbone with a dynamic
    input height/width instead of writing a file that is wrong at other
    sizes.
    """
    from mmdeploy.core import FUNCTION_REWRITER
    ctx = FUNCTION_REWRITER.get_context('torch.onnx.export')
    model = args[0] if args else kwargs.get('model')
    if isinstance(model, torch.nn.Module):
        refuse_dynamic_hw(model, kwargs.get('dynamic_axes'),
                          kwargs.get('input_names'))
    kwargs.setdefault('dynamo', False)
    return ctx.origin_func(*args, **kwargs)


def adaptive_pool_matrix(size: int, out: int,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(out, size)``: row ``i`` averages PyTorch's adaptive-pooling bin
    ``[floor(i size / out), ceil((i + 1) size / out))`` of one axis."""
    m = torch.zeros(out, size, dtype=dtype)
    for i in range(out):
        a, b = (i * size) // out, -(-(i + 1) * size // out)
        m[i, a:b] = 1.0 / (b - a)
    return m


def _adaptive_avg_pool2d__exact(input: torch.Tensor,
                                output_size: Any) -> torch.Tensor:
    """MMDeploy function rewriter of ``adaptive_avg_pool2d`` for the ONNX
    Runtime backend: exact at static sizes (see the module docstring)."""
    import torch.nn.functional as F
    from mmdeploy.core import FUNCTION_REWRITER
    from mmdeploy.utils import is_dynamic_shape
    ctx = FUNCTION_REWRITER.get_context()
    H, W = int(input.shape[-2]), int(input.shape[-1])
    size = output_size if isinstance(output_size,
                                     (tuple, list)) else (output_size, ) * 2
    oh, ow = (int(o) if o is not None else d for o, d in zip(size, (H, W)))
    if oh == ow == 1:
        return ctx.origin_func(input, output_size)
    if is_dynamic_shape(ctx.cfg) or (H % oh == 0 and W % ow == 0):
        k = (H // oh, W // ow)  # MMDeploy's rule (exact when divisible)
        return F.avg_pool2d(input, kernel_size=k, stride=k)
    ph = adaptive_pool_matrix(H, oh, input.dtype).to(input.device)
    pw = adaptive_pool_matrix(W, ow, input.dtype).to(input.device)
    return torch.matmul(torch.matmul(ph, input), pw.t())


def _rpn_head__predict_by_feat__levelwise(self: Any,
                                          cls_scores: List[torch.Tensor],
                                          bbox_preds: List[torch.Tensor],
                                          score_factors: Any = None,
                                          batch_img_metas: Any = None,
                                          cfg: Any = None,
                                          rescale: bool = False,
                                          with_nms: bool = True,
                                          **kwargs: Any) -> Any:
    """MMDeploy function rewriter of mmdet's ``RPNHead.predict_by_feat``
    for the ONNX Runtime backend: mmdet's level-wise NMS in the graph (see
    the module docstring). Returns ``(dets, labels)`` as MMDeploy's own
    rewrite does: ``dets`` ``(B, max_per_img, 5)`` (boxes and scores, best
    first, zero rows where there are fewer), ``labels`` ``(B,
    max_per_img)`` (all 0: one class)."""
    cfg = self.test_cfg if cfg is None else cfg
    batch = cls_scores[0].shape[0]
    sizes = [c.shape[-2:] for c in cls_scores]
    priors = self.prior_generator.grid_priors(
        sizes, device=cls_scores[0].device)
    nms_pre = cfg.get('nms_pre', -1)
    img_shape = batch_img_metas[0]['img_shape']
    boxes, scores, levels = [], [], []
    for level, (cls, reg, anchors) in enumerate(
            zip(cls_scores, bbox_preds, priors)):
        cls = cls.detach().permute(0, 2, 3, 1)
        if self.use_sigmoid_cls:
            score = cls.reshape(batch, -1).sigmoid()
        else:  # background last since mmdet 2.5
            score = cls.reshape(batch, -1, 2).softmax(-1)[..., 0]
        reg = reg.detach().permute(0, 2, 3, 1).reshape(
            batch, -1, self.bbox_coder.encode_size)
        anchors = anchors.unsqueeze(0).expand(batch, -1, -1)
        if 0 < nms_pre < score.shape[1]:
            score, keep = score.topk(nms_pre, dim=1)
            reg = reg.gather(1, keep.unsqueeze(-1).expand(-1, -1,
                                                          reg.shape[-1]))
            anchors = anchors.gather(1, keep.unsqueeze(-1).expand(-1, -1, 4))
        boxes.append(self.bbox_coder.decode(anchors, reg,
                                            max_shape=img_shape))
        scores.append(score)
        levels.append(torch.full_like(score, float(level)))
    box = torch.cat(boxes, 1)
    score = torch.cat(scores, 1)
    level = torch.cat(levels, 1).unsqueeze(-1)
    min_size = cfg.get('min_bbox_size', -1)
    if min_size >= 0:  # mmdet drops these before its NMS
        wh = box[..., 2:] - box[..., :2]
        score = score * ((wh[..., 0] > min_size) &
                         (wh[..., 1] > min_size)).to(score.dtype)
    dets, _ = _nms_in_groups(box, score, level.squeeze(-1),
                             cfg.nms.get('iou_threshold', 0.7), 0.0,
                             cfg.max_per_img)
    return dets, torch.zeros_like(dets[..., 4], dtype=torch.long)


def _nms_in_groups(box: torch.Tensor, score: torch.Tensor,
                   group: torch.Tensor, iou_threshold: float,
                   score_threshold: float, keep: int) -> Any:
    """mmdet's ``batched_nms`` in an exported graph: boxes ``(B, M, 4)``
    with scores ``(B, M)`` and group ids ``(B, M)`` (levels, classes; float)
    suppress only within their group. The boxes are offset by ``group *
    (max coordinate + 1)`` (as mmdet does) for one ONNX
    ``NonMaxSuppression``; the ``keep`` best with score above
    ``score_threshold`` come back as ``dets`` ``(B, keep, 5)`` (offsets
    taken off, zero rows where fewer) and their group ids ``(B, keep)``."""
    from mmdeploy.mmcv.ops import multiclass_nms
    span = box.max() + 1
    dets, _ = multiclass_nms(
        box + group.unsqueeze(-1) * span, score.unsqueeze(-1),
        max_output_boxes_per_class=keep, iou_threshold=iou_threshold,
        score_threshold=score_threshold, pre_top_k=-1, keep_top_k=keep)
    ids = torch.floor(dets[..., :1] / span)
    return torch.cat([dets[..., :4] - ids * span, dets[..., 4:]], -1), \
        ids.squeeze(-1)


def _bbox_head__predict_by_feat__classwise(self: Any, rois: Any,
                                           cls_scores: Any, bbox_preds: Any,
                                           batch_img_metas: Any,
                                           rcnn_test_cfg: Any = None,
                                           rescale: bool = False) -> Any:
    """MMDeploy function rewriter of mmdet's ``BBoxHead.predict_by_feat``
    for the ONNX Runtime backend: every class's own box, as mmdet's
    ``multiclass_nms`` (MMDeploy keeps only the box of each RoI's best class
    for all classes, so a detection of another class gets that class's box).
    Returns ``(dets, labels)`` as MMDeploy's rewrite does."""
    import torch.nn.functional as F
    from mmdet.structures.bbox import get_box_tensor
    img_shape = batch_img_metas[0]['img_shape']
    if self.custom_cls_channels:
        scores = self.loss_cls.get_activation(cls_scores)
    else:
        scores = F.softmax(cls_scores, dim=-1)
    scores = scores[..., :self.num_classes]  # (B, N, C), background off
    boxes = get_box_tensor(self.bbox_coder.decode(
        rois[..., 1:], bbox_preds, max_shape=img_shape))
    batch, num, classes = scores.shape
    size = self.bbox_coder.encode_size
    boxes = boxes.reshape(batch, num, -1, size).expand(-1, -1, classes, -1)
    group = torch.arange(classes, device=scores.device,
                         dtype=scores.dtype).expand(batch, num, classes)
    dets, ids = _nms_in_groups(
        boxes.reshape(batch, -1, size), scores.reshape(batch, -1),
        group.reshape(batch, -1), rcnn_test_cfg.nms.get('iou_threshold'),
        rcnn_test_cfg.get('score_thr', 0.0), rcnn_test_cfg.max_per_img)
    return dets, ids.long()


def register_mmdeploy_rewriters(core: Optional[ModuleType] = None) -> bool:
    """Register the ``torch.onnx.export`` rewriter and the ONNX Runtime
    ``adaptive_avg_pool2d`` and ``RPNHead.predict_by_feat`` rewriters in
    MMDeploy's ``FUNCTION_REWRITER`` (only where torch defaults to the
    dynamo exporter; idempotent).

    Args:
        core: the imported ``mmdeploy.core`` (imported here if None).

    Returns:
        True if the rewriter is registered.
    """
    if not needs_torchscript_exporter():
        return False
    with _lock:
        if applied['rewriters']:
            return True
        if core is None:
            import mmdeploy.core as core
        core.FUNCTION_REWRITER.register_rewriter(
            func_name='torch.onnx.export')(_onnx_export__torchscript)
        core.FUNCTION_REWRITER.register_rewriter(
            func_name='torch.nn.functional.adaptive_avg_pool2d',
            backend='onnxruntime')(_adaptive_avg_pool2d__exact)
        core.FUNCTION_REWRITER.register_rewriter(
            func_name='mmdet.models.dense_heads.rpn_head.'
            'RPNHead.predict_by_feat',
            backend='onnxruntime')(_rpn_head__predict_by_feat__levelwise)
        core.FUNCTION_REWRITER.register_rewriter(
            func_name='mmdet.models.roi_heads.bbox_heads.bbox_head.'
            'BBoxHead.predict_by_feat',
            backend='onnxruntime')(_bbox_head__predict_by_feat__classwise)
        applied['rewriters'] = True
    return True


def _apply(core: ModuleType) -> None:
    """Both fixes, once ``mmdeploy.core`` is importable."""
    provide_removed_symbolics()
    register_mmdeploy_rewriters(core)


class _CallbackLoader(importlib.abc.Loader):
    """A loader that runs ``callback(module)`` after the wrapped loader has
    executed the module; everything else is the wrapped loader's."""

    def __init__(self, loader: importlib.abc.Loader,
                 callback: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        try:
            self._callback(module)
        except Exception as exc:  # never break the user's import
            print_log(
                f'pola_mm: could not apply the MMDeploy fixes '
                f'({type(exc).__name__}: {exc}); exports with torch '
                f'{torch.__version__} may fail', logger='current',
                level=30)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ...
        return getattr(self._loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after one module is first imported (then
    removes itself from ``sys.meta_path``)."""

    def __init__(self, name: str, callback: Callable[[ModuleType],
                                                     None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[ModuleType] = None
                  ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, 'find_spec', None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None:
            spec.loader = _CallbackLoader(spec.loader, self.callback)
        return spec


def install_mmdeploy_fixes() -> str:
    """Apply the fixes now if ``mmdeploy.core`` is imported, else when it
    is. Does nothing on a torch whose ``torch.onnx.export`` still defaults
    to the TorchScript exporter (torch < 2.9).

    Returns:
        ``'applied'``, ``'deferred'`` (the import hook is installed) or
        ``'not needed'``.
    """
    if not needs_torchscript_exporter():
        return 'not needed'
    core = sys.modules.get('mmdeploy.core')
    if core is not None:
        _apply(core)
        return 'applied'
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport('mmdeploy.core', _apply))
    return 'deferred'


install_mmdeploy_fixes()
