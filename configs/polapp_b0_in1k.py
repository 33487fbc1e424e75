# PolaFormer++ PolaPP-b0, ImageNet-1k, 8 GPUs x 256 images (cfgs/pola_b0.yaml).
# lr 0.002 for the batch of 2048; drop path 0.1 (the authors' model
# definition POLA_b0). Top-1 reported by the authors: 76.9 (their README,
# 7M parameters, 0.7G FLOPs).
# Schedule, weight decay and grad clip: ./_base_/polapp_in1k.py (300 epochs,
# 20 warm-up, weight decay 0.05, clip 5.0).
_base_ = ['./_base_/polapp_in1k.py']

model = dict(
    backbone=dict(arch='b0', drop_path_rate=0.1),
    neck=dict(in_channels=384))

train_dataloader = dict(batch_size=256)
optim_wrapper = dict(optimizer=dict(lr=0.002))
auto_scale_lr = dict(base_batch_size=2048)
