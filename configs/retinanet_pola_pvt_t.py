# RetinaNet, Pola-PVT-T backbone, COCO detection, 1x schedule.
# 12 epochs (lr x0.1 after 8, 11; 500-iter linear warm-up), single scale
# 1333x800, AdamW lr 1e-4, weight decay 1e-4 on every parameter, drop path
# 0.1, 2 images per GPU x 8 GPUs (16 per iteration).
# Reference: LeapLabTHU/Agent-Attention downstream/detection/configs/
#   agent_pvt/agent_pvt_t_rtn_1x_12-16-28-28.py
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    'mmdet::_base_/default_runtime.py',
    './_base_/schedules/det_1x.py',
    './_base_/models/pola_pvt_t_fpn.py',
]
custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _base_.pola_backbone, drop_path_rate=_base_.pola_retinanet_drop_path),
    neck=_base_.pola_neck)
optim_wrapper = _base_.pola_retinanet_optim_wrapper

train_dataloader = dict(batch_size=2, num_workers=2)
