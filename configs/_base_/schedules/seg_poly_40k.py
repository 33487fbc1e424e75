# 40k-iteration ADE20K schedule of the Semantic FPN configs (the reference
# protocol: Agent-Attention segmentation/configs/agent_pvt/
# fpn_agent_pvt_*.py): poly decay (power 0.9) to 0, no warm-up. The
# optimiser is not set here: each config takes the snippet's
# (../models/pola_pvt_train.py, ``pola_seg_optim_wrapper``), which replaces
# mmseg's SGD inherited below. The recipe's lr is for 16 images per
# iteration.
_base_ = 'mmseg::_base_/schedules/schedule_40k.py'

param_scheduler = [
    dict(
        type='PolyLR',
        power=0.9,
        eta_min=0.0,
        begin=0,
        end=40000,
        by_epoch=False)
]

auto_scale_lr = dict(enable=False, base_batch_size=16)
