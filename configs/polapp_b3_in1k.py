# PolaFormer++ PolaPP-b3, ImageNet-1k, 8 GPUs x 128 images (cfgs/pola_b3.yaml).
# lr 0.001 for the batch of 1024; drop path 0.15 (the authors' model
# definition POLA_b3). Top-1 reported by the authors: 84.3 (their classifier).
# Schedule, weight decay and grad clip: ./_base_/polapp_in1k.py (300 epochs,
# 20 warm-up, weight decay 0.05, clip 5.0).
_base_ = ['./_base_/polapp_in1k.py']

model = dict(
    backbone=dict(arch='b3', drop_path_rate=0.15),
    neck=dict(in_channels=512))

train_dataloader = dict(batch_size=128)
optim_wrapper = dict(optimizer=dict(lr=0.001))
auto_scale_lr = dict(base_batch_size=1024)
