# Pola-PVT on ImageNet-1k: 5 warm-up epochs, no grad clip (M/L set 1.0).
_base_ = ['./pola_in1k_runtime.py']

model = dict(
    backbone=dict(type='PolaPVT', pretrain_img_size=224),
    head=dict(in_channels=512))

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=5,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=5),
]
