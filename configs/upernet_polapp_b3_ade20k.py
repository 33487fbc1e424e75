# UperNet, PolaFormer++ PolaPP-b3 backbone, ADE20K 512x512: the PolaFormer
# ADE20K protocol of upernet_pola_swin_t_ade20k.py (UperNet + auxiliary FCN
# head; 160k iterations, AdamW lr 6e-5, weight decay 0.01, none on norms,
# 1500-iter linear warm-up, poly (power 1.0), 2 images per GPU x 8 GPUs),
# for comparison with Pola-Swin. Drop path 0.15 (the authors' for b3);
# backbone BatchNorms in eval mode (norm_eval=True).
# The authors' own ADE20K protocol is a LightHamHead:
# ham_polapp_b3_ade20k.py. This one is not theirs (no reported result).
_base_ = [
    'mmseg::_base_/models/upernet_swin.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    './_base_/schedules/seg_poly_160k.py',
    './_base_/models/polapp_b3_fpn.py',
]
custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

crop_size = (512, 512)
data_preprocessor = dict(size=crop_size)
model = dict(
    pretrained=None,
    data_preprocessor=data_preprocessor,
    backbone=_base_.pola_backbone,
    decode_head=dict(in_channels=_base_.pola_channels, num_classes=150),
    auxiliary_head=dict(in_channels=_base_.pola_channels[2], num_classes=150))
optim_wrapper = _base_.pola_seg_optim_wrapper

train_dataloader = dict(batch_size=2, num_workers=4)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
