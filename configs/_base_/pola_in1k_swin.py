# Pola-Swin on ImageNet-1k: 20 warm-up epochs, grad clip 5.0.
_base_ = ['./pola_in1k_runtime.py']

model = dict(backbone=dict(type='PolaSwinTransformer', pretrain_img_size=224))

optim_wrapper = dict(clip_grad=dict(max_norm=5.0))

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=20,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=20),
]
