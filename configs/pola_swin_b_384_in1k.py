# Pola-Swin-B fine-tuned at 384x384 on ImageNet-1k from the 224 checkpoint,
# 8 GPUs x 32 images: the authors' cfgs/pola_swin_b_384.yaml (IMG_SIZE 384,
# WINDOW_SIZE 96, DROP_PATH_RATE 0.5, BATCH_SIZE 32, EPOCHS 30,
# WARMUP_EPOCHS 5, BASE_LR 2e-5, WARMUP_LR 2e-8, MIN_LR 2e-7,
# WEIGHT_DECAY 1e-8, TEST.CROP False; everything else as pola_swin_b_in1k.py:
# grad clip 5.0, RandAugment / random erasing / Mixup / CutMix / label
# smoothing, no weight decay on 1-D parameters, biases and relative position
# bias tables).
#
# Layout at 384 with window 96 (the authors' rule): polarity stages 1-2 hold
# 96x96 and 48x48 ``positional_encoding`` grids, softmax stages 3-4 use 12x12
# windows (23x23 relative position bias tables).
#
# Starting point: checkpoints/pola_swin_b_in1k.pth (or
# $POLA_PRETRAINED/pola_swin_b_in1k.pth): an mmpretrain checkpoint of
# configs/pola_swin_b_in1k.py or the authors' 224 file converted by
# tools/model_converters/pola_official_to_mm.py. As the authors' --pretrained
# does, the backbone and the classifier head are loaded; the backbone's loader
# resizes the 56x56 / 28x28 ``positional_encoding`` grids and the 13x13
# relative position bias tables bicubically to the 384 layout.
_base_ = ['./_base_/pola_in1k_swin.py']

img_size = 384
pretrained = '{{$POLA_PRETRAINED:checkpoints}}/pola_swin_b_in1k.pth'

model = dict(
    backbone=dict(
        arch='base',
        pretrain_img_size=img_size,
        window_size=96,
        drop_path_rate=0.5,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    head=dict(
        in_channels=1024,
        init_cfg=dict(
            _delete_=True, type='Pretrained', checkpoint=pretrained,
            prefix='head')))

# As the 224 recipe, at 384; the authors' test transform with TEST.CROP false
# is a bicubic resize to a 384x384 square, no crop.
bgr_mean = [103.53, 116.28, 123.675]
bgr_std = [57.375, 57.12, 58.395]
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(
        type='RandomResizedCrop',
        scale=img_size,
        backend='pillow',
        interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(
        type='RandAugment',
        policies='timm_increasing',
        num_policies=2,
        total_level=10,
        magnitude_level=9,
        magnitude_std=0.5,
        hparams=dict(
            pad_val=[round(x) for x in bgr_mean], interpolation='bicubic')),
    dict(
        type='RandomErasing',
        erase_prob=0.25,
        mode='rand',
        min_area_ratio=0.02,
        max_area_ratio=1 / 3,
        fill_color=bgr_mean,
        fill_std=bgr_std),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(
        type='Resize',
        scale=(img_size, img_size),
        keep_ratio=False,
        backend='pillow',
        interpolation='bicubic'),
    dict(type='PackInputs'),
]
train_dataloader = dict(batch_size=32, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(batch_size=32, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

# lr 2e-5 per 512 images at 8 x 32 images; weight decay 1e-8
optim_wrapper = dict(optimizer=dict(lr=1e-5, weight_decay=1e-8))
auto_scale_lr = dict(base_batch_size=256)

# 30 epochs: 5 warm-up epochs from WARMUP_LR (ratio 1e-3 of lr), cosine to
# MIN_LR (ratio 1e-2) over all 30, stepped per iteration.
train_cfg = dict(max_epochs=30)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=5,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min_ratio=1e-2, by_epoch=True,
         begin=0, end=30, convert_to_iter_based=True),
]
