# Mask R-CNN, Pola-Swin-B backbone, COCO instance segmentation,
# 3x schedule.
# 36 epochs (lr x0.1 after 27, 33; 500-iter linear warm-up), multi-scale
# training (short side 480-800) with random crop, AdamW lr 1e-4, weight decay
# 0.05 (none on norms / relative position bias), drop path 0.4,
# 2 images per GPU x 8 GPUs (16 per iteration).
# Reference: Agent-Attention has no config for this model; drop path 0.4 is
# its Swin-B value for the other detector / schedule (docs/protocol.md).
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    './_base_/datasets/coco_instance_ms_crop.py',
    'mmdet::_base_/default_runtime.py',
    './_base_/schedules/det_3x.py',
    './_base_/models/pola_swin_b_fpn.py',
]
custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

model = dict(
    backbone=_base_.pola_backbone,
    neck=_base_.pola_neck)
optim_wrapper = _base_.pola_optim_wrapper

train_dataloader = dict(batch_size=2, num_workers=2)
