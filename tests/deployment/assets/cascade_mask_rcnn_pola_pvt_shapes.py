# A tiny Cascade Mask R-CNN with a Pola-PVT backbone for the shapes set, the
# cascade detector of the deployment tests: mask_rcnn_pola_pvt_shapes.py
# with mmdet's three-stage cascade box heads (class-agnostic regression,
# IoU 0.5 / 0.6 / 0.7) at 64 channels. Its weights
# (cascade_mask_rcnn_pola_pvt_shapes.pth, float16) come from
#
#   python tools/misc/make_shapes_dataset.py --out data/shapes
#   python tools/train.py \
#       tests/deployment/assets/cascade_mask_rcnn_pola_pvt_shapes.py \
#       --work-dir work_dirs/cascade_shapes
#
# (400 iterations of 8 images, seed 0), state dict converted to float16.
_base_ = ['./mask_rcnn_pola_pvt_shapes.py']

channels = 64
box_head = dict(
    type='Shared2FCBBoxHead',
    in_channels=channels,
    fc_out_channels=channels,
    roi_feat_size=7,
    num_classes=3,
    reg_class_agnostic=True,
    loss_cls=dict(
        type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
    loss_bbox=dict(type='SmoothL1Loss', beta=1.0, loss_weight=1.0))
coder = dict(type='DeltaXYWHBBoxCoder', target_means=[0., 0., 0., 0.])
stage_train = dict(
    sampler=dict(type='RandomSampler', num=64, pos_fraction=0.25,
                 neg_pos_ub=-1, add_gt_as_pos=True),
    mask_size=28,
    pos_weight=-1,
    debug=False)
assigner = dict(type='MaxIoUAssigner', match_low_quality=False,
                ignore_iof_thr=-1)
extractor = dict(type='SingleRoIExtractor', out_channels=channels,
                 featmap_strides=[4, 8, 16, 32], finest_scale=16)

model = dict(
    roi_head=dict(
        _delete_=True,
        type='CascadeRoIHead',
        num_stages=3,
        stage_loss_weights=[1, 0.5, 0.25],
        bbox_roi_extractor=dict(
            extractor,
            roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=0)),
        bbox_head=[
            dict(box_head,
                 bbox_coder=dict(coder, target_stds=[0.1, 0.1, 0.2, 0.2])),
            dict(box_head,
                 bbox_coder=dict(coder,
                                 target_stds=[0.05, 0.05, 0.1, 0.1])),
            dict(box_head,
                 bbox_coder=dict(coder,
                                 target_stds=[0.033, 0.033, 0.067, 0.067])),
        ],
        mask_roi_extractor=dict(
            extractor,
            roi_layer=dict(type='RoIAlign', output_size=14,
                           sampling_ratio=0)),
        mask_head=dict(
            type='FCNMaskHead', num_convs=2, in_channels=channels,
            conv_out_channels=channels, num_classes=3,
            loss_mask=dict(type='CrossEntropyLoss', use_mask=True,
                           loss_weight=1.0))),
    train_cfg=dict(rcnn=[
        dict(stage_train,
             assigner=dict(assigner, pos_iou_thr=iou, neg_iou_thr=iou,
                           min_pos_iou=iou)) for iou in (0.5, 0.6, 0.7)
    ]),
    test_cfg=dict(
        rcnn=dict(score_thr=0.05, nms=dict(type='nms', iou_threshold=0.5),
                  max_per_img=20, mask_thr_binary=0.5)))
