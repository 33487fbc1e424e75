#!/usr/bin/env bash
# Demo (initial version; the full train-and-evaluate demo arrives with the
# downstream configs): build Mask R-CNN with a Pola-Swin-T backbone from
# configs/mask_rcnn_pola_swin_t.py through mmdet, run it on an image on the
# CPU, and save the drawn prediction under work_dirs/demo/. The weights are
# random (no pretrained checkpoint is downloaded), so the boxes are meaningless:
# this shows the plugin, the config and the mmdet pipeline working together.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=work_dirs/demo
mkdir -p "$OUT"
"$PY" - "$OUT" <<'EOF'
import os.path as osp
import sys
import time

import numpy as np
import torch
from mmengine.config import Config
from PIL import Image, ImageDraw

import pola_mm  # noqa: F401  (registers PolaSwinTransformer)
from mmdet.apis import inference_detector, init_detector

out_dir = sys.argv[1]
torch.manual_seed(0)

# an image with a few shapes on a gradient
img = np.zeros((480, 640, 3), np.uint8)
img[..., 0] = np.linspace(40, 200, 640, dtype=np.uint8)[None]
img[..., 2] = np.linspace(200, 40, 480, dtype=np.uint8)[:, None]
pil = Image.fromarray(img)
draw = ImageDraw.Draw(pil)
draw.ellipse((80, 90, 260, 270), fill=(230, 60, 60))
draw.rectangle((330, 160, 560, 400), fill=(60, 200, 90))
draw.polygon([(420, 40), (520, 140), (320, 140)], fill=(250, 230, 70))
img_path = osp.join(out_dir, 'demo_input.jpg')
pil.save(img_path)

cfg = Config.fromfile('configs/mask_rcnn_pola_swin_t.py')
t0 = time.time()
model = init_detector(cfg, checkpoint=None, device='cpu')  # no download
backbone = model.backbone
n_params = sum(p.numel() for p in model.parameters()) / 1e6
print(f'built {type(model).__name__} with {type(backbone).__name__} '
      f'({n_params:.1f} M parameters) in {time.time() - t0:.1f} s')

with torch.no_grad():
    feats = backbone(torch.rand(1, 3, 480, 640))
print('backbone outputs for a 480x640 input:',
      ', '.join(str(tuple(f.shape)) for f in feats))

t0 = time.time()
result = inference_detector(model, img_path)
pred = result.pred_instances
print(f'inference on {img_path} (resized to {result.img_shape}) took '
      f'{time.time() - t0:.1f} s: {len(pred)} instances, '
      f'masks {tuple(pred.masks.shape)}')

from mmdet.visualization import DetLocalVisualizer  # noqa: E402
vis = DetLocalVisualizer()
vis.dataset_meta = model.dataset_meta
vis.add_datasample('demo', np.array(pil), result, draw_gt=False,
                   pred_score_thr=0.05,
                   out_file=osp.join(out_dir, 'demo_output.jpg'))
print(f'drawn prediction: {osp.join(out_dir, "demo_output.jpg")}')
EOF
