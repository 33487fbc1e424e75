# UperNet, Pola-Swin-T backbone, ADE20K 512x512.
# 160k iterations, AdamW lr 6e-5, weight decay 0.01 (none on norms / relative
# position bias), 1500-iter linear warm-up, poly (power 1.0), drop path 0.3,
# 2 images per GPU x 8 GPUs (16 per iteration).
# Reference: LeapLabTHU/Agent-Attention downstream/segmentation/configs/
#   agent_swin/upernet_agent_swin_t_9-12-14-7.py
_base_ = [
    'mmseg::_base_/models/upernet_swin.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    './_base_/schedules/seg_poly_160k.py',
    './_base_/models/pola_swin_t_fpn.py',
]
custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

crop_size = (512, 512)
data_preprocessor = dict(size=crop_size)
model = dict(
    pretrained=None,
    data_preprocessor=data_preprocessor,
    backbone=dict(
        _base_.pola_backbone, drop_path_rate=_base_.pola_seg_drop_path),
    decode_head=dict(in_channels=_base_.pola_channels, num_classes=150),
    auxiliary_head=dict(in_channels=_base_.pola_channels[2], num_classes=150))
optim_wrapper = _base_.pola_seg_optim_wrapper

train_dataloader = dict(batch_size=2, num_workers=4)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
