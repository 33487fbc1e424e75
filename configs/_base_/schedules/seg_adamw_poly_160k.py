# UperNet schedule of the Swin family on ADE20K.
#
# 160k iterations, AdamW lr 6e-5, weight decay 0.01, 1500-iteration linear
# warm-up, then poly decay (power 1.0) to 0; no weight decay on norms,
# positional tables, relative position bias, ``power`` / ``scale``.
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
            '.pos_embed': dict(decay_mult=0.),
            '.positional_encoding': dict(decay_mult=0.),
            '.relative_position_bias_table': dict(decay_mult=0.),
            '.power': dict(decay_mult=0.),
            'attn.scale': dict(decay_mult=0.),
        }))

param_scheduler = [
    dict(
        type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0,
        end=1500),
    dict(
        type='PolyLR',
        power=1.0,
        eta_min=0.0,
        begin=1500,
        end=160000,
        by_epoch=False)
]

auto_scale_lr = dict(enable=False, base_batch_size=16)
