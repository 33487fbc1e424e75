# Cascade Mask R-CNN, Pola-Swin-B backbone, COCO instance segmentation,
# 1x schedule.
# 12 epochs (lr steps 8, 11; 500-iter warm-up), single scale 1333x800,
# AdamW lr 1e-4, weight decay 0.05, drop path 0.3, 2 images per GPU x 8 GPUs.
_base_ = [
    'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/default_runtime.py',
    './_base_/schedules/det_adamw_1x.py',
    './_base_/models/pola_swin_b_fpn.py',
]
custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

model = dict(backbone=_base_.pola_backbone, neck=_base_.pola_neck)

train_dataloader = dict(batch_size=2, num_workers=2)
optim_wrapper = dict(optimizer=dict(lr=1e-4, weight_decay=0.05))
