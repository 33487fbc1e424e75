# Cascade Mask R-CNN, Pola-Swin-S backbone, COCO instance segmentation,
# 3x schedule.
# 36 epochs (lr steps 27, 33; 500-iter warm-up), multi-scale 480-800
# short side with random crop,
# AdamW lr 1e-4, weight decay 0.05, drop path 0.3, 2 images per GPU x 8 GPUs.
_base_ = [
    'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py',
    './_base_/datasets/coco_instance_ms_crop.py',
    'mmdet::_base_/default_runtime.py',
    './_base_/schedules/det_adamw_3x.py',
    './_base_/models/pola_swin_s_fpn.py',
]
custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

model = dict(backbone=_base_.pola_backbone, neck=_base_.pola_neck)

train_dataloader = dict(batch_size=2, num_workers=2)
optim_wrapper = dict(optimizer=dict(lr=1e-4, weight_decay=0.05))
