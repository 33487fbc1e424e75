# ImageNet-1k classification recipe shared by the Pola-Swin / Pola-PVT
# configs (the authors' DeiT-style recipe): 300 epochs, AdamW with
# lr 5e-4 per 512 images: each config sets lr for its own total batch
# (8 GPUs x images per GPU) and auto_scale_lr.base_batch_size to that batch,
# so `--auto-scale-lr` rescales linearly for another GPU count, weight decay 0.05, cosine schedule, label smoothing 0.1,
# RandAugment m9, Mixup 0.8, CutMix 1.0, random erasing 0.25.
# Warm-up, drop path, grad clip and batch size are set per model.
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',
]

custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(out_indices=(3, ), drop_rate=0., attn_drop_rate=0.),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        init_cfg=None,
        loss=dict(
            type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    init_cfg=[
        dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.),
        dict(type='Constant', layer='LayerNorm', val=1., bias=0.)
    ],
    train_cfg=dict(augments=[
        dict(type='Mixup', alpha=0.8),
        dict(type='CutMix', alpha=1.0)
    ]),
)

train_dataloader = dict(batch_size=128)
val_dataloader = dict(batch_size=128)
test_dataloader = val_dataloader

# No weight decay on norms, biases, learned position tables, relative
# position biases and the polarity attention's power / scale.
optim_wrapper = dict(
    optimizer=dict(
        type='AdamW', lr=1e-3, weight_decay=0.05, eps=1e-8,
        betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        flat_decay_mult=0.0,
        custom_keys={
            '.positional_encoding': dict(decay_mult=0.0),
            '.pos_embed': dict(decay_mult=0.0),
            '.relative_position_bias_table': dict(decay_mult=0.0),
            '.power': dict(decay_mult=0.0),
            'attn.scale': dict(decay_mult=0.0),
        }),
)

train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)

# lr = 5e-4 * total_batch / 512 (the authors' rule) for 8 GPUs x 128 images;
# OpenMMLab convention: enabled by `tools/train.py --auto-scale-lr`.
auto_scale_lr = dict(base_batch_size=1024, enable=False)
