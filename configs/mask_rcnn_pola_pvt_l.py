# Mask R-CNN, Pola-PVT-L backbone, COCO instance segmentation, 1x schedule.
# 12 epochs (lr x0.1 after 8, 11; 500-iter linear warm-up), single scale
# 1333x800, AdamW lr 2e-4, weight decay 1e-4 on every parameter, drop path
# 0.2, 2 images per GPU x 8 GPUs (16 per iteration).
# Reference: LeapLabTHU/Agent-Attention downstream/detection/configs/
#   agent_pvt/agent_pvt_l_mrcnn_1x_12-16-28-28.py
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/default_runtime.py',
    './_base_/schedules/det_1x.py',
    './_base_/models/pola_pvt_l_fpn.py',
]
custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

model = dict(
    backbone=_base_.pola_backbone,
    neck=_base_.pola_neck)
optim_wrapper = _base_.pola_optim_wrapper

train_dataloader = dict(batch_size=2, num_workers=2)
