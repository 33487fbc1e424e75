# Semantic FPN on ADE20K 512x512, shared by sem_fpn_pola_pvt_*_ade20k.py.
# 40k iterations, AdamW lr 2e-4, weight decay 1e-4, poly (power 0.9),
# 4 images per GPU x 4 GPUs (16 per iteration; with 8 GPUs pass
# --cfg-options train_dataloader.batch_size=2). The backbone and the neck's
# input channels come from the arch's pola_pvt_*_fpn.py snippet, listed next
# to this file in each config's _base_.
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    './schedules/seg_adamw_poly_40k.py',
]

crop_size = (512, 512)
data_preprocessor = dict(size=crop_size)
model = dict(
    pretrained=None,
    data_preprocessor=data_preprocessor,
    decode_head=dict(num_classes=150))

test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(2048, 512), keep_ratio=True),
    dict(type='ResizeToMultiple', size_divisor=32),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs')
]
train_dataloader = dict(batch_size=4, num_workers=4)
val_dataloader = dict(batch_size=1, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
