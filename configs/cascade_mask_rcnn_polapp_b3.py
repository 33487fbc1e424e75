# Cascade Mask R-CNN, PolaFormer++ PolaPP-b3 backbone, COCO instance
# segmentation, 1x schedule.
# Model: the authors' Cascade Mask R-CNN base (ZacharyMeng/PolaFormerPP
#   downstream/detection/configs/_base_/models/PolaPP_cas_rcnn.py): PolaPP-b3
#   (drop path 0.15) + FPN, and in each of the three cascade stages a box head
#   of 4 shared 3x3 convs (SyncBN) + 1 fc with class-specific regression of
#   decoded boxes and a GIoU loss of weight 10; RPN, RoI extractors, mask
#   head, assigners, samplers and test settings as mmdet's Cascade Mask R-CNN.
#   That is exactly ./_base_/models/cascade_mask_rcnn_4conv1f_giou.py (the
#   Swin recipe's heads) with the PolaPP-b3 backbone of
#   ./_base_/models/polapp_b3_fpn.py.
# Schedule and data: the authors publish no config that uses this base; these
#   are those of their Mask R-CNN b3 1x (maskrcnn_b3_1x.py), as in
#   ./mask_rcnn_polapp_b3.py: 12 epochs (lr x0.1 after 8, 11; 500-iter linear
#   warm-up), single scale 1333x800 with flip, AdamW lr 1e-4, weight decay
#   0.05 (none on ``norm`` parameters), fp16 (static loss scale 512),
#   backbone BatchNorms in training mode, 2 images per GPU x 8 GPUs (16 per
#   iteration). The schedule and data are inferred, not stated by the
#   authors (docs/protocol.md).
_base_ = [
    './_base_/models/cascade_mask_rcnn_4conv1f_giou.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/default_runtime.py',
    './_base_/schedules/det_1x.py',
    './_base_/models/polapp_b3_fpn.py',
]
custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _base_.pola_backbone, norm_eval=False),
    neck=_base_.pola_neck)
optim_wrapper = _base_.pola_amp_optim_wrapper

train_dataloader = dict(batch_size=2, num_workers=2)
