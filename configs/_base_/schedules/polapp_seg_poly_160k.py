# ADE20K schedule of the PolaFormer++ LightHamHead segmentors (the authors'
# ZacharyMeng/PolaFormerPP downstream/segmentation/configs/PolaPP/
# polapp_b*.py over their mmseg 0.x _base_/schedules/schedule_160k_adamw.py).
#
# As ./seg_poly_160k.py (160k iterations, poly (power 1.0, to 0) times
# a 1500-iteration linear warm-up factor, 1e-6 -> 1), with validation and
# checkpoints every 8000 iterations. The optimiser is not set here: the
# configs take the snippet's (../models/polapp_train.py,
# ``pola_ham_optim_wrapper``); fp32 (the authors set no fp16). The lr is for
# 64 images per iteration (8 per GPU x 8 GPUs, the authors' run.sh).
_base_ = './seg_poly_160k.py'

train_cfg = dict(val_interval=8000)
default_hooks = dict(checkpoint=dict(interval=8000))

auto_scale_lr = dict(enable=False, base_batch_size=64)
