# PolaPP (PolaFormer++) training settings for users' configs, included by
# every polapp_b*_fpn.py snippet (so listing a snippet is enough):
#
#   optim_wrapper = _base_.pola_optim_wrapper      # COCO detection
#   optim_wrapper = _base_.pola_seg_optim_wrapper  # ADE20K UperNet
#   custom_hooks = _base_.pola_custom_hooks        # stop on a NaN / Inf loss
#
# The optimisers are the authors' (ZacharyMeng/PolaFormerPP; docs/
# protocol.md), for 16 images per iteration: COCO Mask R-CNN AdamW lr 1e-4,
# weight decay 0.05, none on ``norm`` parameters; ADE20K UperNet AdamW lr
# 6e-5, weight decay 0.01, none on ``norm``. The authors train detectors
# with fp16 (a GPU): ``optim_wrapper = dict(_base_.pola_optim_wrapper,
# type='AmpOptimWrapper', loss_scale=512.)``; this plain wrapper also runs
# on a CPU. ``_delete_`` replaces the upstream config's optimiser (an R50
# config's SGD lr 0.02 diverges on a transformer). The schedule stays the
# upstream config's. The same optimisers are those of
# configs/mask_rcnn_polapp_b*.py and configs/upernet_polapp_b3_ade20k.py
# (tests/configs check it).
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
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}))
pola_seg_optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    _scope_='mmengine',  # mmengine's own: no scope lookup, no warning
    optimizer=dict(
        type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}))
pola_custom_hooks = [dict(type='InvalidLossHook', _scope_='mmengine')]
