# UperNet schedule of the Swin family on ADE20K (the reference protocol:
# Agent-Attention segmentation/configs/agent_swin/upernet_agent_swin_*.py).
#
# 160k iterations, AdamW lr 6e-5, weight decay 0.01; no weight decay on
# parameters whose name contains ``norm`` or ``relative_position_bias_table``
# (the polarity attention's ``power`` / ``scale`` / ``positional_encoding``
# are decayed, see docs/protocol.md). Learning rate as mmcv 1.x computed it
# for the reference: poly (power 1.0, to 0) over all 160k iterations, times a
# 1500-iteration linear warm-up factor (1e-6 -> 1) at the start; in mmengine
# that is the two schedulers overlapping (both begin at 0), which is exact
# here because the poly schedule decays to 0.
# The lr is for 16 images per iteration.
_base_ = 'mmseg::_base_/schedules/schedule_160k.py'

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(
        type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(
        custom_keys={
            'norm': dict(decay_mult=0.),
            'relative_position_bias_table': dict(decay_mult=0.),
        }))

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
