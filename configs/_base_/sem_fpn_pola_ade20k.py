# Semantic FPN on ADE20K 512x512, shared by sem_fpn_pola_pvt_*_ade20k.py
# (the reference protocol: Agent-Attention segmentation/configs/agent_pvt/).
# mmseg's own fpn_r50 model and ade20k data (train: random resize 0.5-2.0 of
# 2048x512, crop 512, flip, photometric distortion; test: Resize(2048, 512),
# whole image), 40k iterations, AdamW lr 2e-4, weight decay 1e-4 on every
# parameter, poly (power 0.9), 2 images per GPU x 8 GPUs (16 per iteration).
# The backbone and the neck's input channels come from the arch's
# pola_pvt_*_fpn.py snippet, listed next to this file in each config's _base_.
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    './schedules/seg_poly_40k.py',
]

crop_size = (512, 512)
data_preprocessor = dict(size=crop_size)
model = dict(
    pretrained=None,
    data_preprocessor=data_preprocessor,
    decode_head=dict(num_classes=150))

train_dataloader = dict(batch_size=2, num_workers=4)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
