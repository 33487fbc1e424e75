"""The RoIs a two-stage mmdet detector's heads are counted on: those of
its test pass at most, as the published FLOPs count them
(:func:`published_rois`; docs/flops.md).

This is the one place where the counter relies on more of mmdet than its
public API, and only for the duration of a count. mmdet offers no public
way to run the RoI heads on a fixed number of RoIs:

- the tensor-mode forward (``_forward``, what ``get_flops.py`` runs) takes
  the RPN's proposals as they come (a randomly initialised RPN on a random
  image may keep fewer than ``max_per_img`` after NMS), and its
  ``roi_head.forward`` runs the mask head on ``rois[:100]`` of the whole
  batch (``StandardRoIHead``) or on every proposal (``CascadeRoIHead``),
  not on ``test_cfg.rcnn.max_per_img`` detections per image;
- the test pass (``predict``) runs the heads on what NMS keeps, which
  depends on the values, so the count would too;
- module hooks cannot do it: the mask RoIs go through
  ``mask_roi_extractor``, which is the box head's own extractor when the
  config gives none (``share_roi_extractor``), and a ``shared_head`` that
  the box RoIs go through as well, so a hook there cannot tell the two
  apart.

So :func:`published_rois` sets two instance attributes for the count and
deletes them afterwards (the classes' methods again): ``rpn_head.predict``
(public) with one that cuts or repeats the RPN's own proposals to
``max_per_img``, and ``roi_head._mask_forward`` (mmdet 3.x's private
method that runs a RoI head's mask branch on its ``rois``; every RoI head
of mmdet 3.3 has one) with one that runs it on the first
``max_per_img`` RoIs of each image. A head without ``_mask_forward`` runs
its masks as it does.
"""
import contextlib
import functools
import inspect
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

__all__ = ['published_rois']


def _max_per_img(test_cfg: Any) -> Optional[int]:
    """``max_per_img`` (``max_num`` in old configs) of a head's test
    settings, or None."""
    if test_cfg is None:
        return None
    for key in ('max_per_img', 'max_num'):
        value = test_cfg.get(key) if hasattr(test_cfg, 'get') else None
        if value:
            return int(value)
    return None


def _first_per_image(rois: Tensor, n: int) -> Tuple[Tensor, Tensor]:
    """The first ``n`` RoIs ``(k, 5)`` (``[image, x1, y1, x2, y2]``) of
    each image, in order, and for every RoI the index of a kept RoI of its
    image (itself if kept), to give results back in the caller's shape."""
    keep, back = [], torch.zeros(len(rois), dtype=torch.long,
                                 device=rois.device)
    offset = 0
    for i in torch.unique(rois[:, 0], sorted=True):
        rows = torch.nonzero(rois[:, 0] == i).flatten()
        kept = rows[:n]
        keep.append(kept)
        back[rows] = offset + torch.arange(
            len(rows), device=rois.device) % len(kept)
        offset += len(kept)
    if not keep:
        return rois, back
    return rois[torch.cat(keep)], back


@contextlib.contextmanager
def published_rois(model: nn.Module) -> Iterator[Dict[str, int]]:
    """While active, a two-stage mmdet detector's ``_forward`` runs its RoI
    heads on as many RoIs as its test pass does at most, the convention of
    the published FLOPs (mmdet's ``get_flops.py``, the Swin paper;
    docs/flops.md):

    - the RPN's proposals are exactly ``test_cfg.rpn.max_per_img`` per image
      (1000 in mmdet's configs; the RPN's own proposals, cut or repeated to
      that number, so that random weights do not change the count), and
      every box head stage runs on them (cascade: each stage on the boxes
      the previous one refined, as in ``predict``);
    - every mask head the test pass runs (cascade: the mask head of each
      stage, whose predictions ``predict_mask`` averages) runs on
      ``test_cfg.rcnn.max_per_img`` RoIs per image (100): the final
      detections, here the first proposals.

    Post-processing (NMS, box decoding) is not counted, as before; masks
    are not pasted in ``_forward``. Yields a dict filled with ``proposals``
    and ``detections`` (per image; not more detections than proposals)
    where they apply; a model without ``rpn_head`` / ``roi_head`` runs
    unchanged.
    """
    used: Dict[str, int] = {}
    patched: List[Tuple[nn.Module, str]] = []
    rpn_head = getattr(model, 'rpn_head', None)
    roi_head = getattr(model, 'roi_head', None)
    proposals = _max_per_img(getattr(rpn_head, 'test_cfg', None))
    detections = _max_per_img(getattr(roi_head, 'test_cfg', None))
    if rpn_head is not None and proposals and hasattr(rpn_head, 'predict'):
        predict = rpn_head.predict

        @functools.wraps(predict)
        def fixed_proposals(*args: Any, **kwargs: Any) -> Any:
            results = predict(*args, **kwargs)
            out = []
            for res in results:
                n, device = len(res), res.bboxes.device
                if n == 0:  # no box at all: one box of the whole image
                    h, w = res.metainfo.get('img_shape', (1, 1))[:2]
                    res = type(res)(
                        metainfo=res.metainfo,
                        bboxes=torch.tensor([[0., 0., float(w), float(h)]],
                                            device=device),
                        scores=torch.ones(1, device=device),
                        labels=torch.zeros(1, dtype=torch.long,
                                           device=device))
                    n = 1
                out.append(res[torch.arange(proposals, device=device) % n])
            return out

        rpn_head.predict = fixed_proposals
        patched.append((rpn_head, 'predict'))
        used['proposals'] = proposals
    if roi_head is not None and detections and \
            getattr(roi_head, 'with_mask', False) and \
            hasattr(roi_head, '_mask_forward'):
        mask_forward = roi_head._mask_forward
        signature = inspect.signature(mask_forward)

        @functools.wraps(mask_forward)
        def on_detections(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            rois = bound.arguments.get('rois')
            if rois is None:
                return mask_forward(*args, **kwargs)
            kept, back = _first_per_image(rois, detections)
            bound.arguments['rois'] = kept
            results = mask_forward(*bound.args, **bound.kwargs)
            if len(kept) == len(rois) or not isinstance(results, dict):
                return results
            # the caller (cascade's forward) splits the results by its
            # proposals: one row per RoI again (copies, not counted)
            return {k: v[back] if isinstance(v, Tensor) and v.dim()
                    and v.shape[0] == len(kept) else v
                    for k, v in results.items()}

        roi_head._mask_forward = on_detections
        patched.append((roi_head, '_mask_forward'))
        used['detections'] = min(detections, proposals or detections)
    try:
        yield used
    finally:
        for module, name in patched:
            delattr(module, name)  # the class's method again
