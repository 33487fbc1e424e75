# Semantic FPN, Pola-PVT-L backbone, ADE20K 512x512.
# 40k iterations, AdamW lr 2e-4, weight decay 1e-4, poly (power 0.9),
# 4 images per GPU x 4 GPUs (16 per iteration; with 8 GPUs pass
# --cfg-options train_dataloader.batch_size=2).
_base_ = [
    './_base_/sem_fpn_pola_ade20k.py',
    './_base_/models/pola_pvt_l_fpn.py',
]

model = dict(backbone=_base_.pola_backbone, neck=_base_.pola_neck)
