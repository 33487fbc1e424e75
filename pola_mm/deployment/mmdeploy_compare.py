"""Matching the backend's results with PyTorch's, per image.

What is compared, per image (MMDeploy task):

- **detection / instance segmentation** (``ObjectDetection``): the final
  detections of both models' ``test_step`` (boxes rescaled to the image,
  scores, labels, masks pasted to the image). Each side's *compared*
  detections are every detection with score >= ``score_thr`` and, where
  fewer are that confident, its ``top_k`` best whatever their scores
  (:func:`compared_indices`), so an untrained model that is confident of
  nothing is still compared on its 20 best. Each compared detection of
  either side must have a counterpart on the other side with the same
  label, a box within ``box_rtol`` of the image scale (its longer side) at
  any score (one side's detection may rank just outside the compared ones),
  a score within ``score_atol`` and, with masks, a mask IoU >= ``mask_iou``
  (pixels at a near-tie of the binary threshold, in PyTorch's soft mask,
  may flip). The order of near-equal scores does not matter: unmatched
  detections of the two sides with scores within ``score_atol`` and boxes
  that would suppress each other are a swap (NMS and the per-image cap
  break ties by order), also where the swap pushed one of them just below
  its side's cut (a detection within ``score_atol`` of the lowest compared
  score: :func:`near_cut`), and a detection the other side cut at its
  full cap with a tie is excused; both are counted in the check's detail,
  with how many detections each side had compared. The tail below
  both is not compared one to one: MMDeploy's post-processing keeps up to
  ``pre_top_k`` = 5000 candidates per image before NMS where mmdet's
  test_cfg keeps ``nms_pre``, so far down the ranking the two may
  legitimately differ.
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
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

__all__ = [
    'DEFAULT_TOP_K', 'Check', 'compared_indices', 'near_cut',
    'compare_detections',
    'compare_segmentation', 'compare_classification'
]

#: Detections compared on each side at least, whatever their scores.
DEFAULT_TOP_K = 20


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


def _iou_matrix(a: Tensor, b: Tensor) -> Tensor:
    """Pairwise IoU of ``(N, 4)`` and ``(M, 4)`` xyxy boxes: ``(N, M)``."""
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).clamp(min=0).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).clamp(min=0).prod(-1)
    return inter / (area_a[:, None] + area_b[None, :] - inter).clamp(min=1e-9)


#: Soft mask values (0-255, mmdet's soft masks) within this of the binary
#: threshold 0.5 are near-ties: they may binarise either way.
MASK_TIE = 2


def _mask_iou(a: Tensor, b: Tensor, soft: Optional[Tensor] = None) -> float:
    """IoU of two binary masks; with PyTorch's ``soft`` mask (0-255), the
    pixels where they disagree at a near-tie (``soft`` within
    :data:`MASK_TIE` of 127.5) count as agreeing."""
    a, b = a.bool(), b.bool()
    if soft is not None:
        tie = (soft.float() - 127.5).abs() <= MASK_TIE
        b = torch.where(tie & (a != b), a, b)
    union = (a | b).sum().item()
    if union == 0:
        return 1.0
    return float((a & b).sum().item() / union)


def compared_indices(dets: Any, score_thr: float, top_k: int) -> Tensor:
    """The indices of the detections of one side that are compared: every
    one with score >= ``score_thr`` and, where fewer are, the ``top_k``
    best by score (all of them where there are fewer than ``top_k``).

    Returns:
        ``(n,)`` indices into ``dets``, best score first.
    """
    order = torch.argsort(dets.scores.float(), descending=True, stable=True)
    confident = int((dets.scores >= score_thr).sum())
    return order[:max(confident, min(int(top_k), len(order)))]


def _counterparts(src: Any, dst: Any, keep: Tensor,
                  box_tol: float) -> List[Tuple[int, int]]:
    """For each compared detection ``keep`` of ``src``, the ``dst``
    detection of the same label with the nearest score among those whose
    box is within ``box_tol`` (largest coordinate difference), of any score
    (a counterpart ranked just outside the compared ones is a flip, not a
    miss); -1 where there is none."""
    pairs = []
    for i in keep.tolist():
        same = torch.nonzero(dst.labels == src.labels[i]).flatten()
        if same.numel():
            diff = (dst.bboxes[same].float() -
                    src.bboxes[i].float()).abs().amax(-1)
            near = same[diff <= box_tol]
            if near.numel():  # of those, the nearest score (tied twins)
                gap = (dst.scores[near].float() - src.scores[i].float()).abs()
                pairs.append((i, int(near[int(gap.argmin())])))
                continue
        pairs.append((i, -1))
    return pairs


def near_cut(dets: Any, compared: Tensor, score_atol: float) -> Tensor:
    """The detections of one side ranked below its compared ones
    (``compared``, :func:`compared_indices`) whose score is within
    ``score_atol`` of the cut's (the lowest compared score): those that
    near-equal scores may have swapped across the cut.

    Returns:
        ``(n,)`` indices into ``dets``.
    """
    if not len(compared) or len(compared) == len(dets):
        return compared[:0]
    cut = float(dets.scores[compared].float().min())
    beyond = torch.ones(len(dets), dtype=torch.bool)
    beyond[compared] = False
    near = beyond & (dets.scores.float() >= cut - score_atol)
    return torch.nonzero(near).flatten()


def _is_swap(a: Any, i: int, b: Any, j: int, score_atol: float,
             nms_iou: float) -> bool:
    """Whether ``a[i]`` and ``b[j]`` are a pair NMS may have swapped by the
    order of a tie: one label, scores within ``score_atol``, boxes that
    overlap by more than ``nms_iou`` (each would suppress the other)."""
    return (int(a.labels[i]) == int(b.labels[j])
            and abs(float(a.scores[i] - b.scores[j])) <= score_atol
            and float(_iou_matrix(a.bboxes[i:i + 1].float(),
                                  b.bboxes[j:j + 1].float())) > nms_iou)



def _unpaired(lost: List[int], free: List[int],
              swap: Callable[[int, int], bool]) -> List[int]:
    """The indices of ``lost`` that pair with none of ``free`` (``swap(i,
    j)``); each pairing takes its partner out of ``free``."""
    left = []
    for i in lost:
        partner = next((j for j in free if swap(i, j)), None)
        if partner is None:
            left.append(i)
        else:
            free.remove(partner)
    return left

def _tied_swaps(a: Any, a_lost: List[int], b: Any, b_lost: List[int],
                score_atol: float, nms_iou: float,
                a_near: Sequence[int] = (), b_near: Sequence[int] = ()
                ) -> Tuple[int, List[int], List[int]]:
    """Pair the unmatched compared detections of two sides (``a_lost``,
    ``b_lost``) that NMS may have swapped by the order of a tie
    (:func:`_is_swap`): one side kept a box where the other kept its tied
    partner. A partner may also be one of the other side's unmatched
    detections just below its cut (``a_near``, ``b_near``:
    :func:`near_cut`), which the swap pushed out of the compared ones;
    those are never counted as lost themselves.

    Returns:
        How many compared detections were paired (both sides), and the
        compared indices left unpaired on each side.
    """
    free_b = list(b_lost) + list(b_near)
    free_a = list(a_near)
    left_a = _unpaired(a_lost, free_b, lambda i, j: _is_swap(
        a, i, b, j, score_atol, nms_iou))
    left_b = _unpaired([j for j in b_lost if j in free_b], free_a,
                       lambda j, i: _is_swap(a, i, b, j, score_atol,
                                             nms_iou))
    excused = len(a_lost) + len(b_lost) - len(left_a) - len(left_b)
    return excused, left_a, left_b


def _cut_at_cap(score: float, other: Any, cap: Optional[int],
                score_atol: float) -> bool:
    """Whether a detection of ``score`` may be missing on the ``other``
    side because that side is full at its per-image cap ``cap`` and cut it
    with a tie: every detection it kept scores at least ``score -
    score_atol``."""
    return (cap is not None and len(other) >= cap > 0 and bool(
        float(other.scores.min()) >= score - score_atol))


def compare_detections(ref: Any, got: Any, scale: float, score_thr: float,
                       box_rtol: float, score_atol: float,
                       mask_iou: float, cap: Optional[int] = None,
                       nms_iou: float = 0.5,
                       soft_masks: Optional[Tensor] = None,
                       top_k: int = DEFAULT_TOP_K) -> List[Check]:
    """Compare two ``InstanceData`` of detections (PyTorch ``ref``, backend
    ``got``), both ways, independent of the order of tied scores.

    Each side's compared detections (every one with score >=
    ``score_thr``, and at least its ``top_k`` best: :func:`compared_indices`)
    need a counterpart on the other side: the same label and a box within
    ``box_rtol`` of ``scale``, at any score (:func:`_counterparts`).
    Unmatched ones are excused only where ties explain them: pairs of
    unmatched detections of one label with scores within ``score_atol``
    that overlap by more than ``nms_iou`` (NMS swapped them,
    :func:`_tied_swaps`; one of the pair may be an uncompared detection
    just below its side's cut, :func:`near_cut`), and
    detections that the other side, full at the per-image cap ``cap`` (the
    model's ``max_per_img``), cut with a tie. Matched pairs must agree in
    score (``score_atol``) and, with masks, mask IoU; ``soft_masks``,
    PyTorch's masks before binarisation (0-255, in ``ref``'s order), make
    pixels at a near-tie of the threshold agree (:func:`_mask_iou`).

    The first check's ``data`` holds the counts: ``torch`` / ``backend``
    (detections with score >= ``score_thr``), ``compared_torch`` /
    ``compared_backend`` (detections compared), ``matched`` (pairs whose
    boxes, scores and masks were measured), ``tied_swaps`` (compared
    detections excused as swaps) and ``capped``.
    """
    ref = ref.cpu()
    got = got.cpu()
    tol = box_rtol * scale
    worst_box, worst_score, worst_iou = 0.0, 0.0, 1.0
    has_masks = 'masks' in ref and 'masks' in got
    lost: Dict[bool, List[int]] = {True: [], False: []}
    compared = {True: compared_indices(ref, score_thr, top_k),
                False: compared_indices(got, score_thr, top_k)}
    matched = 0
    for a, b, forward in ((ref, got, True), (got, ref, False)):
        for i, j in _counterparts(a, b, compared[forward], tol):
            if j < 0:
                lost[forward].append(i)
                continue
            matched += 1
            worst_box = max(worst_box, float(
                (a.bboxes[i].float() - b.bboxes[j].float()).abs().max()))
            worst_score = max(worst_score,
                              float((a.scores[i] - b.scores[j]).abs()))
            if has_masks:
                r, g = (i, j) if forward else (j, i)
                worst_iou = min(worst_iou, _mask_iou(
                    ref.masks[r], got.masks[g],
                    None if soft_masks is None else soft_masks[r]))
    # just below each side's cut: the unmatched ones a tie may have swapped
    # with a compared one of the other side
    near = {forward: [i for i, j in _counterparts(
        a, b, near_cut(a, compared[forward], score_atol), tol) if j < 0]
        for a, b, forward in ((ref, got, True), (got, ref, False))}
    swaps, left_ref, left_got = _tied_swaps(
        ref, lost[True], got, lost[False], score_atol, nms_iou,
        near[True], near[False])
    capped = (sum(_cut_at_cap(float(ref.scores[i]), got, cap, score_atol)
                  for i in left_ref) +
              sum(_cut_at_cap(float(got.scores[i]), ref, cap, score_atol)
                  for i in left_got))
    unmatched = len(left_ref) + len(left_got) - capped
    counts = dict(
        torch=int((ref.scores >= score_thr).sum()),
        backend=int((got.scores >= score_thr).sum()),
        compared_torch=len(compared[True]),
        compared_backend=len(compared[False]), matched=matched,
        score_thr=score_thr, top_k=int(top_k), tied_swaps=swaps,
        capped=capped)
    checks = [
        Check('compared detections without a counterpart', unmatched, 0,
              detail=_counts_detail(counts, len(ref), len(got)),
              data=counts),
        Check('box max abs diff', worst_box, tol,
              detail=f'{box_rtol:g} of the image scale {scale:g}'),
        Check('score max abs diff', worst_score, score_atol),
    ]
    if has_masks:
        checks.append(Check('mask IoU (worst)', worst_iou, mask_iou, 'min'))
    return checks


def _counts_detail(counts: Dict[str, float], n_ref: int, n_got: int) -> str:
    """The words of the counterpart check: what each side had, what was
    compared, and what ties excused."""
    if not counts['compared_torch'] + counts['compared_backend']:
        return ('nothing compared: neither PyTorch nor the backend has a '
                'detection')
    return (f"compared PyTorch's top {counts['compared_torch']} of {n_ref} "
            f"and the backend's top {counts['compared_backend']} of {n_got} "
            f"(those with score >= {counts['score_thr']:g}: "
            f"{counts['torch']} and {counts['backend']}, and at least the "
            f"top {counts['top_k']}); {counts['tied_swaps']} swapped between "
            f"tied scores, {counts['capped']} at the per-image cap with a tie")


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
