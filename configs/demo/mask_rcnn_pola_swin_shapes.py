# The embedded demo: a small Mask R-CNN with a PolaSwinTransformer backbone
# (polarity-aware linear attention), trained from scratch on the synthetic
# shapes dataset (tools/misc/make_shapes_dataset.py) in a few minutes on CPU.
#
#   make demo            # generate data/shapes, train, evaluate, draw
#   python tools/train.py configs/demo/mask_rcnn_pola_swin_shapes.py
#
# Everything is scaled down for 2 CPU cores: 128 px images, a 32-channel
# backbone, 64-channel FPN and heads, few RoIs, an iteration-based schedule
# (400 iterations of 8 images, about 5 CPU-minutes with one thread), which
# reaches COCO bbox mAP ~0.9 and segm mAP ~0.9 on the 100 validation images.
_base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py']

custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

img_size = 128
embed_dims = 32
neck_channels = 64
num_classes = 3
max_iters = 400
val_interval = max_iters
warmup_iters = 50

model = dict(
    data_preprocessor=dict(pad_size_divisor=32),
    backbone=dict(
        _delete_=True,
        type='PolaSwinTransformer',
        arch=dict(
            embed_dims=embed_dims, depths=(1, 1, 2, 1),
            num_heads=(1, 2, 4, 8)),
        pretrain_img_size=img_size,
        window_size=32,  # global polarity attention in stages 1-2
        softmax_window_size=8,  # global softmax attention in stages 3-4
        drop_path_rate=0.0,
        out_indices=(0, 1, 2, 3),
        init_cfg=None),  # trained from scratch: no ImageNet weights
    neck=dict(
        in_channels=[embed_dims * 2**i for i in range(4)],
        out_channels=neck_channels,
        num_outs=5),
    rpn_head=dict(
        in_channels=neck_channels,
        feat_channels=neck_channels,
        # shapes are 19-51 px: anchors of 16, 32, 64, ... px
        anchor_generator=dict(scales=[4])),
    roi_head=dict(
        bbox_roi_extractor=dict(
            out_channels=neck_channels, finest_scale=16),
        bbox_head=dict(
            in_channels=neck_channels,
            fc_out_channels=256,
            num_classes=num_classes),
        mask_roi_extractor=dict(
            out_channels=neck_channels, finest_scale=16),
        mask_head=dict(
            num_convs=2,
            in_channels=neck_channels,
            conv_out_channels=neck_channels,
            num_classes=num_classes)),
    train_cfg=dict(
        rpn=dict(sampler=dict(num=128)),
        rpn_proposal=dict(nms_pre=500, max_per_img=200),
        rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(
        rpn=dict(nms_pre=300, max_per_img=100),
        rcnn=dict(max_per_img=20)))

# ---------------------------------------------------------------- data
data_root = 'data/shapes/'
metainfo = dict(
    classes=('circle', 'square', 'triangle'),
    palette=[(220, 20, 60), (0, 128, 255), (0, 200, 0)])

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(img_size, img_size), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5, direction=['horizontal', 'vertical']),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(img_size, img_size), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
train_dataloader = dict(
    batch_size=8,
    num_workers=0,
    persistent_workers=False,
    batch_sampler=None,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        filter_cfg=dict(filter_empty_gt=True, min_size=8),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='val/'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator

# ------------------------------------------------------------ schedule
train_cfg = dict(
    _delete_=True,
    type='IterBasedTrainLoop',
    max_iters=max_iters,
    val_interval=val_interval)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0,
         end=warmup_iters),
    dict(type='CosineAnnealingLR', by_epoch=False, begin=warmup_iters,
         end=max_iters, eta_min_ratio=0.01)
]
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=3e-3, weight_decay=0.05),
    clip_grad=dict(max_norm=5.0),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0))
auto_scale_lr = dict(enable=False, base_batch_size=8)

default_hooks = dict(
    logger=dict(interval=50),
    checkpoint=dict(by_epoch=False, interval=max_iters, max_keep_ckpts=1))
log_processor = dict(by_epoch=False)
env_cfg = dict(dist_cfg=dict(backend='gloo'))
randomness = dict(seed=0)
