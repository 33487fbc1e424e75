"""Detection verification independent of the order of ties
(:func:`pola_mm.deployment.mmdeploy_compare.compare_detections`): boxes
with equal scores may swap, a full cap may cut a tied box, a box may flip
below the threshold; a box that moved or vanished still fails; below the
threshold the top k of each side are compared all the same."""
import torch
from mmengine.structures import InstanceData

from pola_mm.deployment.mmdeploy_compare import compare_detections


def _dets(boxes, scores, labels):
    d = InstanceData()
    d.bboxes = torch.tensor(boxes, dtype=torch.float32)
    d.scores = torch.tensor(scores, dtype=torch.float32)
    d.labels = torch.tensor(labels)
    return d


def _check(ref, got, cap=None):
    checks = compare_detections(ref, got, scale=1000., score_thr=0.3,
                                box_rtol=1e-3, score_atol=1e-4, mask_iou=0.99,
                                cap=cap)
    return {c.name: c for c in checks}


BOXES = [[10, 10, 50, 50], [100, 100, 180, 160], [300, 40, 420, 200],
         [500, 500, 600, 640]]


def test_equal_detections_pass():
    ref = _dets(BOXES, [0.9, 0.8, 0.5, 0.4], [1, 2, 1, 3])
    assert all(c.ok for c in _check(ref, ref).values())


def test_tied_boxes_swapped_by_nms_pass():
    """Two overlapping boxes of one label tie at 0.5: NMS keeps the first
    in its order, so PyTorch keeps one and the backend the other."""
    ref = _dets(BOXES[:2] + [[300, 40, 420, 200]], [0.9, 0.8, 0.5], [1, 2, 1])
    got = _dets(BOXES[:2] + [[310, 50, 430, 210]], [0.9, 0.8, 0.50004],
                [1, 2, 1])
    c = _check(ref, got)
    assert all(x.ok for x in c.values()), [str(x) for x in c.values()]
    assert c['compared detections without a counterpart'].data[
        'tied_swaps'] == 2


def test_cap_cuts_a_tied_box_pass():
    """Both sides full (same count) and tied at the bottom: the backend's
    last kept box is another one of the tie."""
    ref = _dets(BOXES, [0.9, 0.8, 0.4, 0.4], [1, 2, 1, 3])
    got = _dets(BOXES[:3] + [[700, 10, 760, 90]], [0.9, 0.8, 0.4, 0.4],
                [1, 2, 1, 0])
    c = _check(ref, got, cap=4)
    assert all(x.ok for x in c.values())
    assert c['compared detections without a counterpart'].data[
        'capped'] == 2
    # not at the cap: both boxes are real differences
    assert not _check(ref, got, cap=100)[
        'compared detections without a counterpart'].ok


def test_flip_below_the_threshold_passes():
    ref = _dets(BOXES, [0.9, 0.8, 0.5, 0.30002], [1, 2, 1, 3])
    got = _dets(BOXES, [0.9, 0.8, 0.5, 0.29998], [1, 2, 1, 3])
    assert all(x.ok for x in _check(ref, got).values())


def test_a_missing_or_moved_box_fails():
    ref = _dets(BOXES, [0.9, 0.8, 0.5, 0.4], [1, 2, 1, 3])
    missing = _dets(BOXES[:3], [0.9, 0.8, 0.5], [1, 2, 1])
    c = _check(ref, missing)['compared detections without a counterpart']
    assert not c.ok and c.value == 1
    moved = _dets(BOXES[:3] + [[560, 500, 660, 640]], [0.9, 0.8, 0.5, 0.4],
                  [1, 2, 1, 3])
    c = _check(ref, moved)['compared detections without a counterpart']
    assert not c.ok and c.value == 2  # lost on both sides, no overlap
    relabelled = _dets(BOXES, [0.9, 0.8, 0.5, 0.4], [1, 2, 1, 4])
    assert not _check(ref, relabelled)[
        'compared detections without a counterpart'].ok
    rescored = _dets(BOXES, [0.9, 0.8, 0.5, 0.45], [1, 2, 1, 3])
    assert not _check(ref, rescored)['score max abs diff'].ok


#: An untrained detector: nothing confident, 25 low scores.
LOW = [0.2 - 0.005 * k for k in range(25)]
LOW_BOXES = [[40 * k, 10, 40 * k + 30, 60] for k in range(25)]


def _moved(k: int) -> list:
    """LOW_BOXES with box ``k`` moved 25 px right (IoU 0.1 with itself)."""
    boxes = [list(b) for b in LOW_BOXES]
    boxes[k][0] += 25
    boxes[k][2] += 25
    return boxes


def test_the_top_k_are_compared_whatever_their_scores():
    """With nothing above the threshold, the 20 best of each side are
    compared (and counted); a moved box among them fails, one ranked
    below them does not count."""
    ref = _dets(LOW_BOXES, LOW, [1] * 25)
    c = _check(ref, ref)['compared detections without a counterpart']
    assert c.ok and c.data['torch'] == 0
    assert c.data['compared_torch'] == c.data['compared_backend'] == 20
    assert c.data['matched'] == 40
    assert "PyTorch's top 20 of 25" in c.detail
    c = _check(ref, _dets(_moved(19), LOW, [1] * 25))  # the 20th best
    assert not c['compared detections without a counterpart'].ok
    c = _check(ref, _dets(_moved(22), LOW, [1] * 25))  # below the top 20
    assert all(x.ok for x in c.values())
    rescored = list(LOW)
    rescored[5] += 1e-3
    assert not _check(ref, _dets(LOW_BOXES, rescored, [1] * 25))[
        'score max abs diff'].ok


def test_the_confident_ones_are_all_compared_beyond_the_top_k():
    scores = [0.9 - 0.01 * k for k in range(25)]
    ref = _dets(LOW_BOXES, scores, [1] * 25)
    c = _check(ref, ref)['compared detections without a counterpart']
    assert c.data['compared_torch'] == c.data['torch'] == 25


def test_nothing_to_compare_is_said():
    empty = _dets(torch.zeros(0, 4).tolist(), [], [])
    c = _check(empty, empty)['compared detections without a counterpart']
    assert c.data['compared_torch'] == c.data['compared_backend'] == 0
    assert c.detail.startswith('nothing compared')


#: 19 detections well above the top-20 cut, one label each, apart
ABOVE = [0.3 - 0.005 * k for k in range(19)]
ABOVE_BOXES = [[40 * k, 300, 40 * k + 30, 350] for k in range(19)]
#: the cut's detection A, and B: A's box moved 8 px (IoU 0.6 with it)
A_BOX, B_BOX = [100, 100, 180, 160], [108, 100, 188, 160]
#: another detection C, apart from both
C_BOX = [500, 500, 560, 580]


def _near_cut(a_score: float, b_score: float, c_ref: float, c_got: float,
              b_box: list = B_BOX):
    """PyTorch keeps A at rank 20 and C at 21; the backend, whose scores
    differ by float noise, ranks C 20th and keeps B (A's tied partner in
    NMS, suppressed on PyTorch's side) 21st: below its cut."""
    ref = _dets(ABOVE_BOXES + [A_BOX, C_BOX], ABOVE + [a_score, c_ref],
                [1] * 19 + [2, 3])
    got = _dets(ABOVE_BOXES + [C_BOX, b_box], ABOVE + [c_got, b_score],
                [1] * 19 + [3, 2])
    return _check(ref, got)


def test_near_equal_scores_swapped_at_the_cut_pass():
    """Two detections whose scores swap order across the top-20 cut: each
    side's 20th is found among the other side's detections below its
    cut."""
    scores = list(LOW)
    scores[20] = scores[19] - 2e-5  # the 21st 2e-5 below the 20th
    swapped = list(scores)
    swapped[19], swapped[20] = scores[19] - 1e-5, scores[20] + 2e-5
    ref = _dets(LOW_BOXES, scores, [1] * 25)
    c = _check(ref, _dets(LOW_BOXES, swapped, [1] * 25))
    assert all(x.ok for x in c.values()), [str(x) for x in c.values()]
    assert c['compared detections without a counterpart'].data[
        'matched'] == 40


def test_a_tie_swapped_by_nms_across_the_cut_passes():
    """A (PyTorch's 20th) and B (the backend's 21st) are one tie that NMS
    broke the other way on each side: A's partner lies below the
    backend's cut, and is matched all the same."""
    c = _near_cut(0.10000, 0.09998, 0.09996, 0.09999)
    assert all(x.ok for x in c.values()), [str(x) for x in c.values()]
    counted = c['compared detections without a counterpart']
    assert counted.data['tied_swaps'] == 1
    assert counted.data['compared_backend'] == 20
    assert '1 swapped between tied scores' in counted.detail


def test_a_real_difference_at_the_cut_still_fails():
    """The same layout, but B scores 1e-3 below A (not a tie, and not near
    the backend's cut), or B is a box elsewhere: A has no counterpart."""
    for b_score, b_box in ((0.0990, B_BOX), (0.09998, [300, 100, 380, 160])):
        c = _near_cut(0.10000, b_score, 0.09996, 0.09999, b_box)
        counted = c['compared detections without a counterpart']
        assert not counted.ok and counted.value == 1, counted
        assert counted.data['tied_swaps'] == 0
