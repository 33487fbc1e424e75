# RetinaNet, PolaFormer++ PolaPP-b3 backbone, COCO detection, 1x schedule.
# 12 epochs (lr x0.1 after 8, 11; 500-iter linear warm-up), single scale
# 1333x800 with flip, AdamW lr 1e-4, weight decay 1e-4 on every parameter,
# drop path 0.15, fp16 (static loss scale 512), backbone BatchNorms in
# training mode, 2 images per GPU x 8 GPUs (16 per iteration).
# FPN from stage 2 with extra convs on the input, as the authors' (their
# backbone returns stage 1 too and the FPN skips it, hence their
# find_unused_parameters; here stage 1 is not returned, which computes the
# same and leaves no parameter without a gradient).
# Reference: ZacharyMeng/PolaFormerPP downstream/detection/configs/PolaPP/
#   retinanet_b3_1x.py
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    'mmdet::_base_/default_runtime.py',
    './_base_/schedules/det_1x.py',
    './_base_/models/polapp_b3_fpn.py',
]
custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _base_.pola_backbone,
        norm_eval=False,
        out_indices=(1, 2, 3)),
    neck=dict(in_channels=_base_.pola_channels[1:], start_level=0))
optim_wrapper = _base_.pola_retinanet_optim_wrapper

train_dataloader = dict(batch_size=2, num_workers=2)
