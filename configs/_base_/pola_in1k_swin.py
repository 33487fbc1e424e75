# Pola-Swin on ImageNet-1k (the authors' config.py defaults, which their
# cfgs/pola_swin_*.yaml keep): 300 epochs, 20 warm-up epochs from
# WARMUP_LR 5e-7 to BASE_LR 5e-4 (ratio 1e-3), cosine to MIN_LR 5e-6
# (ratio 0.01) over the 300 epochs, grad clip 5.0; no cool-down.
_base_ = ['./pola_in1k_runtime.py']

model = dict(backbone=dict(type='PolaSwinTransformer', pretrain_img_size=224))

# The authors' Swin skip lists: no_weight_decay() {'absolute_pos_embed'}
# (Pola-Swin has none) and no_weight_decay_keywords()
# {'relative_position_bias_table'} (the softmax stages' tables).
optim_wrapper = dict(
    clip_grad=dict(max_norm=5.0),
    paramwise_cfg=dict(
        custom_keys={
            'absolute_pos_embed': dict(decay_mult=0.0),
            'relative_position_bias_table': dict(decay_mult=0.0),
        }))

train_cfg = dict(max_epochs=300)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=20,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min_ratio=1e-2, by_epoch=True,
         begin=0, end=300, convert_to_iter_based=True),
]
