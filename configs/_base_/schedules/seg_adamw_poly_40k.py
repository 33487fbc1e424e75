# Semantic FPN schedule of the PVT family on ADE20K (the reference protocol:
# Agent-Attention segmentation/configs/agent_pvt/fpn_agent_pvt_*.py).
#
# 40k iterations, AdamW lr 2e-4, weight decay 1e-4 on every parameter (the
# reference sets no paramwise_cfg), poly decay (power 0.9) to 0, no warm-up.
# The lr is for 16 images per iteration.
_base_ = 'mmseg::_base_/schedules/schedule_40k.py'

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(
        type='AdamW', lr=2e-4, betas=(0.9, 0.999), weight_decay=1e-4))

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
