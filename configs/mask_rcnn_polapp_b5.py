# Mask R-CNN, PolaFormer++ PolaPP-b5 backbone, COCO instance segmentation,
# 1x schedule.
# 12 epochs (lr x0.1 after 8, 11; 500-iter linear warm-up), single scale
# 1333x800 with flip, AdamW lr 1e-4, weight decay 0.05 (none on ``norm``
# parameters), drop path 0.55, fp16 (static loss scale 512), backbone
# BatchNorms in training mode, 2 images per GPU x 8 GPUs (16 per iteration).
# Reference: ZacharyMeng/PolaFormerPP downstream/detection/configs/PolaPP/
#   maskrcnn_b5_1x.py
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/default_runtime.py',
    './_base_/schedules/det_1x.py',
    './_base_/models/polapp_b5_fpn.py',
]
custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _base_.pola_backbone, norm_eval=False),
    neck=_base_.pola_neck)
optim_wrapper = _base_.pola_amp_optim_wrapper

train_dataloader = dict(batch_size=2, num_workers=2)
