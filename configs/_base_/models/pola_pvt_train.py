# Pola-PVT training settings, included by every pola_pvt_*_fpn.py snippet
# (so listing a snippet is enough):
#
#   optim_wrapper = _base_.pola_optim_wrapper            # COCO Mask R-CNN
#   optim_wrapper = _base_.pola_retinanet_optim_wrapper  # COCO RetinaNet
#   optim_wrapper = _base_.pola_seg_optim_wrapper        # ADE20K FPN
#   custom_hooks = _base_.pola_custom_hooks  # stop on a NaN / Inf loss
#
# The one source of the family's optimisers: configs/*_pola_pvt_*.py take
# them with one of the first three lines; the schedules (../schedules/) set
# none. They are the reference protocol's (Agent-Attention's agent_pvt
# configs, which PolaFormer follows; docs/protocol.md), for 16 images per
# iteration: AdamW, weight decay 1e-4 on every parameter (the reference sets
# no paramwise_cfg); RetinaNet as Mask R-CNN at half the lr. ``_delete_``
# replaces the upstream config's optimiser (an R50 config's SGD lr 0.02
# diverges on a transformer).
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
        type='AdamW', lr=2e-4, betas=(0.9, 0.999), weight_decay=1e-4))
pola_retinanet_optim_wrapper = dict(
    pola_optim_wrapper,
    optimizer=dict(pola_optim_wrapper['optimizer'], lr=1e-4))
pola_seg_optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    _scope_='mmengine',  # mmengine's own: no scope lookup, no warning
    optimizer=dict(
        type='AdamW', lr=2e-4, betas=(0.9, 0.999), weight_decay=1e-4))
pola_custom_hooks = [dict(type='InvalidLossHook', _scope_='mmengine')]
