"""MMDeploy function rewriters for the ONNX Runtime backend that compute what
mmdet's and mmseg's PyTorch models compute, where MMDeploy 1.3.1's own rewrites
compute something else (found while verifying exported files against PyTorch,
``tools/deployment/deploy.py``):

- **Inexact adaptive pooling** (UperNet): MMDeploy replaces
  ``adaptive_avg_pool2d`` by ``avg_pool2d`` with kernel ``floor(size / out)``
  for every backend but ncnn and TorchScript, which equals adaptive pooling
  only where the map is divisible by the output size (UperNet's pyramid pooling
  at 512x512: the 16x16 map pooled to 3x3 and 6x6 is not), and with dynamic
  shapes its kernel is a constant of the export size, wrong at every other
  size. For the ONNX Runtime backend, a rewriter registered for that backend
  (MMDeploy prefers it to its default one) computes adaptive pooling
  exactly: a product with averaging matrices, ``P_h x P_w^T``, whose rows
  average PyTorch's bins ``[floor(i H / h), ceil((i + 1) H / h))``;
  constants at static sizes (where the map is divisible it keeps MMDeploy's
  ``avg_pool2d``), computed in the graph from the map's traced size with
  dynamic shapes. mmseg's own UperNet gets the same, exact, file.

- **Cross-level RPN NMS and one box per RoI** (Mask R-CNN, Cascade): MMDeploy's
  ``RPNHead.predict_by_feat`` rewrite runs one NMS over the proposals of all
  levels, with the deploy config's score threshold (0.05), where mmdet runs a
  level-wise NMS (``batched_nms`` by level) without one and drops empty boxes
  first. The proposals, and then every detection of Mask R-CNN and Cascade,
  differ from mmdet's. For the ONNX Runtime backend a rewriter computes mmdet's
  rule in the graph: per level the ``nms_pre`` best, decoded and clipped; empty
  boxes scored 0; one ONNX ``NonMaxSuppression`` over boxes offset by ``level *
  (max coordinate + 1)`` (mmdet's own ``batched_nms`` trick, so boxes of
  different levels never overlap), the ``max_per_img`` best kept and the
  offsets taken off again. Likewise MMDeploy's ``BBoxHead.predict_by_feat``
  keeps, for every class, the box of each RoI's best class, where mmdet decodes
  each class's own box (``reg_class_agnostic=False``, Mask R-CNN's default);
  its ONNX Runtime rewriter here runs the same grouped NMS over every (RoI,
  class) pair with its own box, as mmdet's ``multiclass_nms``.

- **Flat boxes of one-stage detectors** (RetinaNet): MMDeploy's
  ``BaseDenseHead.predict_by_feat`` rewrite keeps boxes whose width or
  height is not above ``min_bbox_size`` (0 in mmdet's RetinaNet configs:
  boxes clipped flat at the image border), which mmdet drops before its
  NMS. Its ONNX Runtime rewriter here scores them 0 first.

Each is registered for the ``onnxruntime`` backend only (MMDeploy prefers a
backend's rewriter to its default one) by
:func:`pola_mm.deployment.mmdeploy_fixes.register_mmdeploy_rewriters`,
when MMDeploy is imported. They change what MMDeploy exports for mmdet's
and mmseg's own models too, toward what those compute in PyTorch; nothing
of the PyTorch models changes.
"""
import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch

__all__ = [
    'ONNXRUNTIME_REWRITERS', 'adaptive_pool_matrix',
    'adaptive_avg_pool2d__exact', 'rpn_head__predict_by_feat__levelwise',
    'bbox_head__predict_by_feat__classwise', 'nms_in_groups',
    'base_dense_head__predict_by_feat__min_size'
]


def adaptive_pool_matrix(size: Any, out: int,
                         dtype: torch.dtype = torch.float32,
                         device: Optional[torch.device] = None
                         ) -> torch.Tensor:
    """``(out, size)``: row ``i`` averages PyTorch's adaptive-pooling bin
    ``[floor(i size / out), ceil((i + 1) size / out))`` of one axis.

    ``size`` may be an int or a traced size (0-d tensor): the matrix is then
    computed in the graph (``Range``, integer arithmetic, comparisons), so
    a file with a dynamic height/width pools exactly at every size.
    """
    i = torch.arange(out, device=device)[:, None]
    j = torch.arange(size, device=device)[None, :]
    start = (i * size) // out
    end = ((i + 1) * size + out - 1) // out
    inside = (j >= start) & (j < end)
    return inside.to(dtype) / (end - start).to(dtype)


def adaptive_avg_pool2d__exact(input: torch.Tensor,
                               output_size: Any) -> torch.Tensor:
    """MMDeploy function rewriter of ``adaptive_avg_pool2d`` for the ONNX
    Runtime backend: exact at every size (see the module docstring)."""
    import torch.nn.functional as F
    from mmdeploy.core import FUNCTION_REWRITER
    from mmdeploy.utils import is_dynamic_shape
    ctx = FUNCTION_REWRITER.get_context()
    size = output_size if isinstance(output_size,
                                     (tuple, list)) else (output_size, ) * 2
    dynamic = is_dynamic_shape(ctx.cfg)
    if dynamic and any(o is None for o in size):
        return ctx.origin_func(input, output_size)
    if dynamic:  # traced sizes: the matrices follow the graph's input
        H, W = input.shape[-2], input.shape[-1]
        oh, ow = int(size[0]), int(size[1])
    else:
        H, W = int(input.shape[-2]), int(input.shape[-1])
        oh, ow = (int(o) if o is not None else d
                  for o, d in zip(size, (H, W)))
    if oh == ow == 1:
        return ctx.origin_func(input, output_size)
    if not dynamic and H % oh == 0 and W % ow == 0:
        k = (H // oh, W // ow)  # MMDeploy's rule (exact when divisible)
        return F.avg_pool2d(input, kernel_size=k, stride=k)
    ph = adaptive_pool_matrix(H, oh, input.dtype, input.device)
    pw = adaptive_pool_matrix(W, ow, input.dtype, input.device)
    return torch.matmul(torch.matmul(ph, input), pw.t())


def rpn_head__predict_by_feat__levelwise(self: Any,
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
            reg, anchors = (t.gather(1, keep.unsqueeze(-1).expand(
                -1, -1, t.shape[-1])) for t in (reg, anchors))
        boxes.append(self.bbox_coder.decode(anchors, reg,
                                            max_shape=img_shape))
        scores.append(score)
        levels.append(torch.full_like(score, float(level)))
    box = torch.cat(boxes, 1)
    score = torch.cat(scores, 1)
    level = torch.cat(levels, 1)
    score = score * _not_flat(box, cfg).to(score.dtype)
    dets, _ = nms_in_groups(box, score, level,
                            cfg.nms.get('iou_threshold', 0.7), 0.0,
                            cfg.max_per_img)
    return dets, torch.zeros_like(dets[..., 4], dtype=torch.long)


def _not_flat(box: torch.Tensor, cfg: Any) -> torch.Tensor:
    """mmdet's ``min_bbox_size`` rule, which it applies before its NMS:
    True for the boxes ``(..., 4)`` wider and higher than
    ``cfg.min_bbox_size`` (every box where the config has none)."""
    min_size = cfg.get('min_bbox_size', -1)
    wh = box[..., 2:] - box[..., :2]
    if min_size < 0:
        return torch.ones_like(wh[..., 0], dtype=torch.bool)
    return (wh[..., 0] > min_size) & (wh[..., 1] > min_size)


def nms_in_groups(box: torch.Tensor, score: torch.Tensor,
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


def bbox_head__predict_by_feat__classwise(self: Any, rois: Any,
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
    dets, ids = nms_in_groups(
        boxes.reshape(batch, -1, size), scores.reshape(batch, -1),
        group.reshape(batch, -1), rcnn_test_cfg.nms.get('iou_threshold'),
        rcnn_test_cfg.get('score_thr', 0.0), rcnn_test_cfg.max_per_img)
    return dets, ids.long()


@contextlib.contextmanager
def _lend_context(func: Callable[..., Any], ctx: Any) -> Iterator[None]:
    """Let MMDeploy's own rewrite ``func`` run inside ours: it looks up its
    context (the deploy config) by its own name, which MMDeploy registers
    only for the rewriter it chose (ours), so ``ctx`` is lent to it for the
    call (MMDeploy 1.3.1's ``FUNCTION_REWRITER._func_contexts``)."""
    from mmdeploy.core import FUNCTION_REWRITER
    from mmdeploy.core.rewriters.rewriter_utils import (ContextCaller,
                                                        get_func_qualname)
    lent = ContextCaller(func, ctx.origin_func, ctx.cfg)
    contexts = FUNCTION_REWRITER._func_contexts[get_func_qualname(func)]
    contexts.append(lent)
    try:
        yield
    finally:
        contexts.remove(lent)


def base_dense_head__predict_by_feat__min_size(self: Any,
                                               cls_scores: List[torch.Tensor],
                                               bbox_preds: List[torch.Tensor],
                                               score_factors: Any = None,
                                               batch_img_metas: Any = None,
                                               cfg: Any = None,
                                               rescale: bool = False,
                                               with_nms: bool = True,
                                               **kwargs: Any) -> Any:
    """MMDeploy function rewriter of mmdet's ``BaseDenseHead.predict_by_feat``
    (one-stage detectors: RetinaNet, ...) for the ONNX Runtime backend:
    MMDeploy's own rewrite, plus mmdet's ``min_bbox_size`` rule, which it
    leaves out. mmdet drops the boxes whose width or height is not above
    ``min_bbox_size`` (0 in its RetinaNet configs: boxes clipped flat at
    the image border) before its NMS; MMDeploy kept them, so an untrained
    RetinaNet on a photo had confident flat boxes PyTorch has not. Here
    their scores are 0 before the same NMS. Returns what MMDeploy's
    rewrite returns (``(dets, labels)``, or boxes and scores without
    NMS)."""
    from mmdeploy.codebase.mmdet.deploy import get_post_processing_params
    from mmdeploy.codebase.mmdet.models.dense_heads.base_dense_head import \
        base_dense_head__predict_by_feat as mmdeploy_rewrite
    from mmdeploy.core import FUNCTION_REWRITER
    from mmdeploy.mmcv.ops import multiclass_nms
    ctx = FUNCTION_REWRITER.get_context()
    with _lend_context(mmdeploy_rewrite, ctx):
        boxes, scores = mmdeploy_rewrite(self, cls_scores, bbox_preds,
                                         score_factors, batch_img_metas, cfg,
                                         rescale, with_nms=False, **kwargs)
    if not with_nms:
        return boxes, scores
    cfg = self.test_cfg if cfg is None else cfg
    scores = scores * _not_flat(boxes, cfg).unsqueeze(-1).to(scores.dtype)
    post = get_post_processing_params(ctx.cfg)
    return multiclass_nms(
        boxes, scores, post.max_output_boxes_per_class,
        nms_type=cfg.nms.get('type'),
        iou_threshold=cfg.nms.get('iou_threshold', post.iou_threshold),
        score_threshold=cfg.get('score_thr', post.score_threshold),
        pre_top_k=post.pre_top_k,
        keep_top_k=cfg.get('max_per_img', post.keep_top_k))


#: MMDeploy function name -> rewriter, for the ``onnxruntime`` backend.
ONNXRUNTIME_REWRITERS: Dict[str, Callable[..., Any]] = {
    'torch.nn.functional.adaptive_avg_pool2d': adaptive_avg_pool2d__exact,
    'mmdet.models.dense_heads.rpn_head.RPNHead.predict_by_feat':
    rpn_head__predict_by_feat__levelwise,
    'mmdet.models.roi_heads.bbox_heads.bbox_head.BBoxHead.predict_by_feat':
    bbox_head__predict_by_feat__classwise,
    'mmdet.models.dense_heads.base_dense_head.BaseDenseHead.predict_by_feat':
    base_dense_head__predict_by_feat__min_size,
}
