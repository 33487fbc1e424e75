# Pola-PVT training settings for users' configs, included by every
# pola_pvt_*_fpn.py snippet (so listing a snippet is enough):
#
#   optim_wrapper = _base_.pola_optim_wrapper      # COCO detection
#   optim_wrapper = _base_.pola_seg_optim_wrapper  # ADE20K segmentation
#   custom_hooks = _base_.pola_custom_hooks        # stop on a NaN / Inf loss
#
# The optimisers are the reference protocol's (Agent-Attention's agent_pvt
# configs, which PolaFormer follows; docs/protocol.md), for 16 images per
# iteration, weight decay 1e-4 on every parameter: COCO Mask R-CNN AdamW lr
# 2e-4 (the RetinaNet configs use 1e-4:
# ``optim_wrapper = dict(_base_.pola_optim_wrapper,
# optimizer=dict(_base_.pola_optim_wrapper.optimizer, lr=1e-4))``); ADE20K
# Semantic FPN AdamW lr 2e-4. ``_delete_`` replaces the upstream config's
# optimiser (an R50 config's SGD lr 0.02 diverges on a transformer). The
# schedule (warm-up, steps) stays the upstream config's. The same values are
# the optim_wrapper of configs/mask_rcnn_pola_pvt_*.py and
# configs/sem_fpn_pola_pvt_*_ade20k.py (tests/configs check it).
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
pola_seg_optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    _scope_='mmengine',  # mmengine's own: no scope lookup, no warning
    optimizer=dict(
        type='AdamW', lr=2e-4, betas=(0.9, 0.999), weight_decay=1e-4))
pola_custom_hooks = [dict(type='InvalidLossHook', _scope_='mmengine')]
