# Semantic FPN, Pola-PVT-M backbone, ADE20K 512x512.
# 40k iterations, AdamW lr 2e-4, weight decay 1e-4 on every parameter, poly
# (power 0.9), drop path 0.2, 2 images per GPU x 8 GPUs (16 per iteration).
# Reference: LeapLabTHU/Agent-Attention downstream/segmentation/configs/
#   agent_pvt/fpn_agent_pvt_m_12-16-28-28.py
_base_ = [
    './_base_/sem_fpn_pola_ade20k.py',
    './_base_/models/pola_pvt_m_fpn.py',
]

model = dict(
    backbone=dict(
        _base_.pola_backbone, drop_path_rate=_base_.pola_seg_drop_path),
    neck=_base_.pola_neck)
optim_wrapper = _base_.pola_seg_optim_wrapper
