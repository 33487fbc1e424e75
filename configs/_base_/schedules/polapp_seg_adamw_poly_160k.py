# ADE20K schedule of the PolaFormer++ segmentors (the authors'
# ZacharyMeng/PolaFormerPP downstream/segmentation/configs/PolaPP/
# polapp_b*.py over their mmseg 0.x _base_/schedules/schedule_160k_adamw.py).
#
# 160k iterations; AdamW lr 6e-5, betas (0.9, 0.999), weight decay 0.01; no
# weight decay on parameters whose name contains ``norm``, lr x10 on those
# containing ``head`` (the decode head); the authors' third key,
# 'pos_block', matches no PolaPP parameter and is left out. Learning rate as
# mmcv 1.x computed it: poly (power 1.0, to 0) over all 160k iterations,
# times a 1500-iteration linear warm-up factor (1e-6 -> 1), i.e. the two
# schedulers overlapping, as ./seg_adamw_poly_160k.py. fp32 (the authors set
# no fp16). Validation and checkpoints every 8000 iterations.
# The lr is for 64 images per iteration (8 per GPU x 8 GPUs, the authors'
# run.sh).
_base_ = './seg_adamw_poly_160k.py'

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(
        type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(
        custom_keys={
            'norm': dict(decay_mult=0.),
            'head': dict(lr_mult=10.),
        }))

train_cfg = dict(val_interval=8000)
default_hooks = dict(checkpoint=dict(interval=8000))

auto_scale_lr = dict(enable=False, base_batch_size=64)
