# Pola-PVT on ImageNet-1k (the authors' cfgs/pola_pvt_*.yaml): 300 epochs +
# 10 cool-down epochs (COOLDOWN_EPOCHS: 10), 5 warm-up epochs from
# WARMUP_LR 1e-6 to BASE_LR 5e-4 (ratio 2e-3), cosine to MIN_LR 1e-5
# (ratio 0.02) over the first 300 epochs, then the last 10 at that minimum.
# Grad clip: none for T/S, 1.0 for M/L (set there). The authors' PVT skip
# list is {'cls_token'} (no such parameter) with no keywords: only 1-D
# parameters and biases are not decayed (pos_embed1..4 are).
_base_ = ['./pola_in1k_runtime.py']

model = dict(
    backbone=dict(type='PolaPVT', pretrain_img_size=224),
    head=dict(in_channels=512))

train_cfg = dict(max_epochs=310)
param_scheduler = [
    dict(type='LinearLR', start_factor=2e-3, by_epoch=True, begin=0, end=5,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min_ratio=2e-2, by_epoch=True,
         begin=0, end=300, convert_to_iter_based=True),
]
