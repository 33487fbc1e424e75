# LightHamHead (SegNeXt's Hamburger decoder) over a PolaPP backbone on
# ADE20K 512x512, shared by ham_polapp_b*_ade20k.py: the authors' protocol
# (ZacharyMeng/PolaFormerPP downstream/segmentation/configs/PolaPP/
# polapp_b{1,2,3}.py, mmseg 0.x), point by point in docs/protocol.md.
#
# - Head: LightHamHead on stages 2-4, 512 channels, NMF with R = 16 (6 steps
#   in training, 7 in evaluation), GroupNorm (32 groups), dropout 0.1, cross
#   entropy; whole-image inference.
# - Data: mmseg's ADE20K training augmentation (random resize 0.5-2.0 of
#   2048x512, crop 512 with cat_max_ratio 0.75, flip, photometric
#   distortion); test: resize to 2048x512 keeping the ratio, then to a
#   multiple of 32 (the authors' ResizeToMultiple). 8 images per GPU.
# - Schedule: ./schedules/polapp_seg_poly_160k.py.
# The backbone (with its drop path) and the head's input channels come from
# the arch's polapp_b*_fpn.py snippet, listed next to this file in each
# config's _base_; ``backbone`` below is that snippet's placeholder.
_base_ = [
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    './schedules/polapp_seg_poly_160k.py',
]

crop_size = (512, 512)
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255,
    size=crop_size)
model = dict(
    type='EncoderDecoder',
    data_preprocessor=data_preprocessor,
    pretrained=None,
    backbone=dict(type='PolaPP'),
    decode_head=dict(
        type='LightHamHead',
        in_index=[0, 1, 2],
        channels=512,
        ham_channels=512,
        ham_kwargs=dict(
            MD_S=1,
            MD_R=16,
            train_steps=6,
            eval_steps=7,
            inv_t=100,
            rand_init=True),
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=dict(type='GN', num_groups=32, requires_grad=True),
        align_corners=False,
        loss_decode=dict(
            type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'))

test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(2048, 512), keep_ratio=True),
    dict(type='ResizeToMultiple', size_divisor=32),
    # annotations after the resizes: the metric compares at the original
    # size (the prediction is resized back)
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs')
]
train_dataloader = dict(batch_size=8, num_workers=4)
val_dataloader = dict(batch_size=1, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
