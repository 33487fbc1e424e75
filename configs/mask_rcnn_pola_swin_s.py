# Mask R-CNN, Pola-Swin-S backbone, COCO instance segmentation,
# 1x schedule.
# 12 epochs (lr x0.1 after 8, 11; 500-iter linear warm-up), multi-scale
# training (short side 480-800) with random crop, AdamW lr 1e-4, weight decay
# 0.05 (none on norms / relative position bias), drop path 0.1,
# 2 images per GPU x 8 GPUs (16 per iteration).
# Reference: LeapLabTHU/Agent-Attention downstream/detection/configs/
#   agent_swin/agent_swin_s_mrcnn_1x_9-12-14-7.py
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    './_base_/datasets/coco_instance_ms_crop.py',
    'mmdet::_base_/default_runtime.py',
    './_base_/schedules/det_1x.py',
    './_base_/models/pola_swin_s_fpn.py',
]
custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

model = dict(
    backbone=_base_.pola_backbone,
    neck=_base_.pola_neck)
optim_wrapper = _base_.pola_optim_wrapper

train_dataloader = dict(batch_size=2, num_workers=2)
