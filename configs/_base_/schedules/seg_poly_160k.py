# 160k-iteration ADE20K schedule of the UperNet configs (the reference
# protocol: Agent-Attention segmentation/configs/agent_swin/
# upernet_agent_swin_*.py).
#
# Learning rate as mmcv 1.x computed it for the reference: poly (power 1.0,
# to 0) over all 160k iterations, times a 1500-iteration linear warm-up
# factor (1e-6 -> 1) at the start; in mmengine that is the two schedulers
# overlapping (both begin at 0), which is exact here because the poly
# schedule decays to 0. The optimiser is not set here: each config takes
# its family's from the snippet (../models/*_train.py,
# ``pola_seg_optim_wrapper``), which replaces mmseg's SGD inherited below.
# The recipes' lr is for 16 images per iteration.
_base_ = 'mmseg::_base_/schedules/schedule_160k.py'

param_scheduler = [
    dict(
        type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0,
        end=1500),
    dict(
        type='PolyLR',
        power=1.0,
        eta_min=0.0,
        begin=0,
        end=160000,
        by_epoch=False)
]

auto_scale_lr = dict(enable=False, base_batch_size=16)
