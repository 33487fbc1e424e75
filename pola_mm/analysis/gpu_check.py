"""What ``make gpu-check`` measures beyond the benchmark, and its table.

- :func:`measure_whole_train`: training steps of a whole detector (a config
  file, or the zoo's softmax counterpart of one) on synthetic images with
  boxes and masks: the median step time and the peak allocated memory, as
  the backbone benchmark reports them.
- :func:`ratio_table`: the tables ``make gpu-check`` ends with: Pola over
  softmax for each row of the GPU goals, and the attention's Triton kernels
  beside the torch path they replace (and ``torch.compile`` at batch 1),
  from the benchmark's ``--json`` results and :func:`measure_whole_train`'s.
"""
import statistics
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..type_aliases import Size2

__all__ = ['synthetic_detection_batch', 'measure_whole_train', 'GOALS',
           'ratio_table', 'kernel_table']


def synthetic_detection_batch(batch: int, hw: Size2, boxes: int = 10,
                              classes: int = 80, seed: int = 0
                              ) -> Dict[str, Any]:
    """``batch`` random ``uint8`` images of ``hw`` with ``boxes`` boxes and
    box-shaped masks each: the ``data`` a detector's ``train_step`` takes."""
    import numpy as np
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    H, W = int(hw[0]), int(hw[1])
    g = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, H, W), generator=g,
                                    dtype=torch.uint8))
        sample = DetDataSample(metainfo=dict(
            img_shape=(H, W), ori_shape=(H, W), scale_factor=(1.0, 1.0)))
        xy = torch.rand(boxes, 2, generator=g) * torch.tensor(
            [W * 0.7, H * 0.7])
        wh = torch.rand(boxes, 2, generator=g) * torch.tensor(
            [W * 0.3, H * 0.3]) + 16
        xyxy = torch.cat([xy, (xy + wh).minimum(torch.tensor([W, H]))], 1)
        masks = np.zeros((boxes, H, W), np.uint8)
        for j, (x1, y1, x2, y2) in enumerate(xyxy.int().tolist()):
            masks[j, y1:y2, x1:x2] = 1
        sample.gt_instances = InstanceData(
            bboxes=xyxy, labels=torch.randint(0, classes, (boxes, ),
                                              generator=g),
            masks=BitmapMasks(masks, H, W))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def measure_whole_train(spec: Any, batch: int = 2,
                        hw: Size2 = (800, 1344), amp: Optional[str] = None,
                        steps: int = 5, warmup: int = 2,
                        device: str = 'cuda') -> Dict[str, Any]:
    """Training steps of a whole detector: forward with losses, backward
    (through mmengine's ``AmpOptimWrapper`` with ``amp='fp16'``/``'bf16'``)
    and an AdamW step; the ImageNet weights are not loaded.

    Args:
        spec: a config file, or :func:`pola_mm.analysis.zoo.counterpart`'s
            answer for one (the same config with mmdet's softmax backbone).
        batch, hw: images per step and their size.
        amp: None (float32) or the autocast dtype's name.
        steps, warmup: timed and untimed steps.
        device: ``'cuda'`` (times synchronised; peak allocated memory) or
            ``'cpu'``.

    Returns:
        ``time_median`` (s), ``peak_mem_mb`` (``max_memory_allocated``
        over the steps, CUDA only, else None) and the ``losses`` of the
        steps.
    """
    from mmengine.optim import AmpOptimWrapper, OptimWrapper

    from ..models.from_config import load_config
    from .zoo import build
    if isinstance(spec, str):
        cfg = load_config(spec)
        cfg.model.backbone.init_cfg = None
        spec = {'_config_': spec, 'backbone': dict(cfg.model.backbone)}
        spec['backbone']['_scope_'] = 'pola_mm'
    else:
        spec = dict(spec, backbone=dict(spec['backbone'], init_cfg=None))
    torch.manual_seed(0)
    model = build(spec).model.to(device)
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4,
                              weight_decay=0.05)
    if amp is not None:
        dtype = {'fp16': torch.float16, 'bf16': torch.bfloat16}[amp]
        wrapper: Any = AmpOptimWrapper(optimizer=optim, dtype=dtype)
    else:
        wrapper = OptimWrapper(optimizer=optim)
    data = synthetic_detection_batch(batch, hw)
    cuda = device.startswith('cuda')
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for i in range(warmup + steps):
        sync()
        t0 = time.perf_counter()
        log = model.train_step(data, wrapper)
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        losses.append(float(torch.as_tensor(log['loss']).detach()))
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    return dict(time_median=statistics.median(times), peak_mem_mb=peak,
                losses=losses)


#: The rows of the GPU table and their goals (Pola / softmax as a ratio):
#: (label, benchmark mode, dtype, batch, quantity, Swin goal, PVT goal).
GOALS: Sequence[Tuple[str, str, str, int, str, float, float]] = (
    ('backbone train step, batch 2, float32', 'train', 'float32', 2,
     'time_median', 1.0, 0.8),
    ('backbone train step, batch 2, fp16 autocast', 'train', 'fp16', 2,
     'time_median', 1.0, 0.8),
    ('backbone inference, batch 1', 'infer', 'float32', 1, 'time_median',
     1.0, 0.8),
    ('peak memory in training', 'train', 'float32', 2, 'peak_mem_mb', 0.85,
     0.5),
    ('peak memory in inference', 'infer', 'float32', 1, 'peak_mem_mb', 1.0,
     1.0),
)
#: The pairs of the table's columns (Pola model, its softmax baseline).
PAIRS = (('pola_swin_t', 'swin_t'), ('pola_pvt_t', 'pvt_t'))
#: The rows of the kernels' table: (label, mode, dtype, batch).
KERNEL_ROWS: Sequence[Tuple[str, str, str, int]] = (
    ('train step, batch 2, float32', 'train', 'float32', 2),
    ('train step, batch 2, fp16 autocast', 'train', 'fp16', 2),
    ('inference, batch 1', 'infer', 'float32', 1),
)


def _cell(a: Optional[float], b: Optional[float], goal: float) -> str:
    if not a or not b:
        return 'not measured'
    r = a / b
    return f'{r:.2f}x ({"ok" if r <= goal else "MISSED"} <= {goal:g}x)'


def ratio_table(results: List[Dict[str, Any]],
                whole: Optional[Dict[str, Dict[str, Any]]] = None,
                whole_goal: float = 0.95) -> str:
    """The markdown table of Pola / softmax ratios.

    Args:
        results: the benchmark's ``--json`` dicts (every mode and dtype).
        whole: :func:`measure_whole_train` results keyed ``'pola'`` and
            ``'softmax'`` (the Mask R-CNN pair under AMP), if measured.
        whole_goal: the goal of the whole-model row.
    """
    def find(name, mode, dtype, batch):
        return _find(results, name, mode, dtype, batch)

    head = '| what | ' + ' | '.join(f'{a} / {b}' for a, b in PAIRS) + ' |'
    lines = [head, '|---|' + '---|' * len(PAIRS)]
    for label, mode, dtype, batch, key, *goals in GOALS:
        cells = []
        for (pola, soft), goal in zip(PAIRS, goals):
            a, b = find(pola, mode, dtype, batch), find(soft, mode, dtype,
                                                        batch)
            cells.append(_cell(a and a.get(key), b and b.get(key), goal))
        lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
    if whole is not None:
        p, s = whole.get('pola') or {}, whole.get('softmax') or {}
        time_cell = _cell(p.get('time_median'), s.get('time_median'),
                          whole_goal)
        mem = p.get('peak_mem_mb'), s.get('peak_mem_mb')
        mem_text = (f', memory {mem[0] / mem[1]:.2f}x' if mem[0] and mem[1]
                    else '')
        lines.append(f'| whole Mask R-CNN train step, AMP | {time_cell}'
                     f'{mem_text} | - |')
    return '\n'.join(lines)


def _find(results: List[Dict[str, Any]], name: str, mode: str, dtype: str,
          batch: int) -> Optional[Dict[str, Any]]:
    """The benchmark result of ``name`` in that mode, dtype and batch
    (None if missing or failed)."""
    for r in results:
        if (r.get('name') == name and r.get('mode') == mode
                and r.get('dtype') == dtype and r.get('batch') == batch
                and not r.get('error')):
            return r
    return None


def kernel_table(results: List[Dict[str, Any]]) -> str:
    """The markdown table of the attention's Triton kernels beside the
    torch path they replace (``<name>`` / ``<name>_torch``, time and peak
    memory) and of ``torch.compile`` at batch 1 (``<name>_compile`` /
    ``<name>``), from the benchmark's ``--json`` dicts."""
    def find(name, mode, dtype, batch):
        return _find(results, name, mode, dtype, batch)

    lines = ['| what | ' + ' | '.join(a for a, _ in PAIRS) + ' |',
             '|---|' + '---|' * len(PAIRS)]
    for label, mode, dtype, batch in KERNEL_ROWS:
        cells = [_pair(find(pola, mode, dtype, batch),
                       find(pola + '_torch', mode, dtype, batch))
                 for pola, _ in PAIRS]
        lines.append(f'| kernels / torch path, {label} | ' +
                     ' | '.join(cells) + ' |')
    for pola, soft in PAIRS:
        cells = [_pair(find(name + '_compile', 'infer', 'float32', 1),
                       find(name, 'infer', 'float32', 1))
                 for name in (pola, soft)]
        lines.append(f'| compiled / eager, inference batch 1: {pola}, '
                     f'{soft} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def _pair(a: Optional[Dict[str, Any]], b: Optional[Dict[str, Any]]) -> str:
    """``time a/b, memory a/b`` of two benchmark results."""
    if not a or not b or not a.get('time_median') or \
            not b.get('time_median'):
        return 'not measured'
    text = f"time {a['time_median'] / b['time_median']:.2f}x"
    if a.get('peak_mem_mb') and b.get('peak_mem_mb'):
        text += f", memory {a['peak_mem_mb'] / b['peak_mem_mb']:.2f}x"
    return text
