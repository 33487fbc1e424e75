# LightHamHead (SegNeXt decoder), PolaFormer++ PolaPP-b2 backbone, ADE20K
# 512x512.
# 160k iterations, AdamW lr 6e-5 (x10 on the head), weight decay 0.01 (none
# on ``norm`` parameters), 1500-iter linear warm-up, poly (power 1.0), drop
# path 0.1, backbone BatchNorms in eval mode, 8 images per GPU x 8 GPUs
# (64 per iteration), fp32.
# The head reads stages 2-4, as the authors' (their backbone also returns
# stage 1, unused, hence their find_unused_parameters; here stage 1 is not
# returned, which computes the same).
# Reference: ZacharyMeng/PolaFormerPP downstream/segmentation/configs/PolaPP/
#   polapp_b2.py
_base_ = [
    './_base_/polapp_ham_ade20k.py',
    './_base_/models/polapp_b2_fpn.py',
]

model = dict(
    backbone=dict(
        _base_.pola_backbone,
        norm_eval=True,
        out_indices=(1, 2, 3)),
    decode_head=dict(in_channels=_base_.pola_channels[1:]))
optim_wrapper = _base_.pola_ham_optim_wrapper
