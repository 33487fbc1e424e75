# Pola-Swin training settings, included by every pola_swin_*_fpn.py
# snippet (so listing a snippet is enough):
#
#   optim_wrapper = _base_.pola_optim_wrapper      # COCO detection
#   optim_wrapper = _base_.pola_seg_optim_wrapper  # ADE20K UperNet
#   custom_hooks = _base_.pola_custom_hooks        # stop on a NaN / Inf loss
#
# The one source of the family's optimisers: configs/*_pola_swin_*.py take
# them with one of the first two lines; the schedules (../schedules/) set
# none. They are the reference protocol's (Agent-Attention's agent_swin
# configs, which PolaFormer follows; docs/protocol.md), for 16 images per
# iteration. No weight decay on norms and relative position bias tables;
# the polarity attention's power / scale / positional_encoding are decayed.
# ``_delete_`` replaces the upstream config's optimiser (an R50 config's SGD
# lr 0.02 diverges on a transformer).
#
# InvalidLossHook stops training at the first NaN / Inf loss, before the
# broken weights are saved, with one line naming the iteration and the
# loss terms, and a non-zero exit under any tool (pola_mm's tools/train.py
# exits 3; the upstream tools exit 1).
pola_optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    _scope_='mmengine',  # mmengine's own: no scope lookup, no warning
    optimizer=dict(
        type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        custom_keys={
            'norm': dict(decay_mult=0.),
            'relative_position_bias_table': dict(decay_mult=0.),
        }))
pola_seg_optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    _scope_='mmengine',  # mmengine's own: no scope lookup, no warning
    optimizer=dict(
        type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(
        custom_keys={
            'norm': dict(decay_mult=0.),
            'relative_position_bias_table': dict(decay_mult=0.),
        }))
pola_custom_hooks = [dict(type='InvalidLossHook', _scope_='mmengine')]
