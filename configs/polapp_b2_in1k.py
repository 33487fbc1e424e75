# PolaFormer++ PolaPP-b2, ImageNet-1k, 8 GPUs x 256 images (cfgs/pola_b2.yaml).
# lr 0.002 for the batch of 2048; drop path 0.1 (the authors' model
# definition POLA_b2). Top-1 reported by the authors: 82.8 (their classifier).
# Schedule, weight decay and grad clip: ./_base_/polapp_in1k.py (300 epochs,
# 20 warm-up, weight decay 0.05, clip 5.0).
_base_ = ['./_base_/polapp_in1k.py']

model = dict(
    backbone=dict(arch='b2', drop_path_rate=0.1),
    neck=dict(in_channels=512))

train_dataloader = dict(batch_size=256)
optim_wrapper = dict(optimizer=dict(lr=0.002))
auto_scale_lr = dict(base_batch_size=2048)
