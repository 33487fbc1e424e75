# ImageNet-1k classification recipe shared by the Pola-Swin / Pola-PVT
# configs: the authors' recipe (ZacharyMeng/PolaFormer main.py, config.py,
# optimizer.py, lr_scheduler.py, data/build.py; timm 0.4.12), point by point
# in docs/protocol.md.
#
# - AdamW (eps 1e-8, betas 0.9 / 0.999), weight decay 0.05, lr 5e-4 per 512
#   images: each config sets lr for its own total batch (8 GPUs x images per
#   GPU) and auto_scale_lr.base_batch_size to that batch, so
#   `--auto-scale-lr` rescales linearly for another GPU count; the warm-up
#   start and the minimum lr are ratios of lr, so they scale with it as the
#   authors' WARMUP_LR / MIN_LR do.
# - No weight decay on 1-D parameters and biases only (the authors'
#   ``len(shape) == 1 or name.endswith('.bias')``, plus their per-model skip
#   lists, set in pola_in1k_swin.py / pola_in1k_pvt.py): ``power``,
#   ``scale``, ``positional_encoding`` and PVT's ``pos_embed*`` are decayed.
# - Schedule stepped per iteration: linear warm-up, cosine to the minimum lr
#   over the training epochs, warm-up and cosine overlapping (the authors'
#   timm cosine counts from iteration 0, warm-up included); cool-down epochs
#   after it stay at the minimum lr. Set per family.
# - Train: random resized crop 224 (bicubic), flip, RandAugment
#   rand-m9-mstd0.5-inc1, random erasing 0.25 (per-pixel random fill), no
#   colour jitter (timm drops it when RandAugment is on), no repeated
#   augmentation, Mixup 0.8 / CutMix 1.0 (switch 0.5), label smoothing 0.1,
#   incomplete last batch dropped.
# - Test: resize to a 256x256 square (bicubic), centre crop 224.
# Drop path, grad clip and batch size are set per model.
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

# The authors' evaluation: torchvision Resize((256, 256)) (a square, not the
# short side) then CenterCrop(224), both on PIL images with bicubic
# interpolation (data/build.py with TEST.CROP true).
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(
        type='Resize',
        scale=(256, 256),
        keep_ratio=False,
        backend='pillow',
        interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]

train_dataloader = dict(batch_size=128, drop_last=True)
val_dataloader = dict(batch_size=128, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

# Decay everything but 1-D parameters and biases; the families add their
# skip-list keys (mmpretrain's base lists '.absolute_pos_embed' and
# '.relative_position_bias_table', dropped here, and re-added for Swin).
optim_wrapper = dict(
    optimizer=dict(
        type='AdamW', lr=1e-3, weight_decay=0.05, eps=1e-8,
        betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        _delete_=True,
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        flat_decay_mult=0.0),
)

train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)

# lr = 5e-4 * total_batch / 512 (the authors' rule) for 8 GPUs x 128 images;
# OpenMMLab convention: enabled by `tools/train.py --auto-scale-lr`.
auto_scale_lr = dict(base_batch_size=1024, enable=False)
