# PolaFormer++ PolaPP-b4, ImageNet-1k, 8 GPUs x 128 images (cfgs/pola_b4.yaml).
# lr 0.001 for the batch of 1024; drop path 0.4 (the authors' model
# definition POLA_b4). Top-1 reported by the authors: 85.4 (their classifier).
# cfgs/pola_b4.yaml: 300 epochs + 10 cool-down epochs at the minimum lr,
# 5 warm-up epochs from WARMUP_LR 1e-7 (ratio 2e-4 of BASE_LR 5e-4), cosine
# to MIN_LR 1e-5 (ratio 0.02), weight decay 0.05, grad clip 1.0.
_base_ = ['./_base_/polapp_in1k.py']

model = dict(
    backbone=dict(arch='b4', drop_path_rate=0.4),
    neck=dict(in_channels=512))

train_dataloader = dict(batch_size=128)
auto_scale_lr = dict(base_batch_size=1024)

optim_wrapper = dict(
    optimizer=dict(lr=0.001), clip_grad=dict(max_norm=1.0))
train_cfg = dict(max_epochs=310)
param_scheduler = [
    dict(type='LinearLR', start_factor=2e-4, by_epoch=True, begin=0, end=5,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min_ratio=2e-2, by_epoch=True,
         begin=0, end=300, convert_to_iter_based=True),
]
