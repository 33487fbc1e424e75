# A tiny RetinaNet with a Pola-PVT backbone for the shapes set
# (tools/misc/make_shapes_dataset.py), the detector of the deployment tests.
# Its weights (retinanet_pola_pvt_shapes.pth, float16) come from
#
#   python tools/misc/make_shapes_dataset.py --out data/shapes
#   python tools/train.py \
#       tests/deployment/assets/retinanet_pola_pvt_shapes.py \
#       --work-dir work_dirs/retinanet_shapes
#
# (400 iterations of 8 images, seed 0), state dict converted to float16.
_base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py']

custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

img_size = 128
chans = [16, 32, 64, 64]
max_iters = 400

model = dict(
    data_preprocessor=dict(pad_size_divisor=32),
    backbone=dict(
        _delete_=True,
        type='PolaPVT',
        arch=dict(embed_dims=chans, depths=[1, 1, 1, 1],
                  num_heads=[1, 2, 2, 4], mlp_ratios=[2, 2, 2, 2],
                  sr_ratios=[8, 4, 2, 1]),
        pretrain_img_size=img_size,
        drop_path_rate=0.0,
        out_indices=(0, 1, 2, 3),
        init_cfg=None),
    neck=dict(in_channels=chans, out_channels=64, start_level=1,
              num_outs=5),
    bbox_head=dict(num_classes=3, in_channels=64, feat_channels=64,
                   stacked_convs=2,
                   anchor_generator=dict(octave_base_scale=2)),
    test_cfg=dict(nms_pre=300, max_per_img=20))

data_root = 'data/shapes/'
metainfo = dict(classes=('circle', 'square', 'triangle'),
                palette=[(220, 20, 60), (0, 128, 255), (0, 200, 0)])
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(img_size, img_size), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5, direction=['horizontal', 'vertical']),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(img_size, img_size), keep_ratio=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                    'scale_factor'))
]
train_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False,
    batch_sampler=None,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_train.json',
                 data_prefix=dict(img='train/'),
                 filter_cfg=dict(filter_empty_gt=True, min_size=8),
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_val.json',
                 data_prefix=dict(img='val/'), pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
val_cfg = None
val_dataloader = None
val_evaluator = None
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0,
         end=50),
    dict(type='CosineAnnealingLR', by_epoch=False, begin=50, end=max_iters,
         eta_min_ratio=0.01)
]
optim_wrapper = dict(_delete_=True, type='OptimWrapper',
                     optimizer=dict(type='AdamW', lr=3e-3,
                                    weight_decay=0.05),
                     clip_grad=dict(max_norm=5.0))
default_hooks = dict(logger=dict(interval=50),
                     checkpoint=dict(by_epoch=False, interval=max_iters,
                                     max_keep_ckpts=1))
log_processor = dict(by_epoch=False)
randomness = dict(seed=0)
