# PolaPP (PolaFormer++) training settings, included by every
# polapp_b*_fpn.py snippet (so listing a snippet is enough):
#
#   optim_wrapper = _base_.pola_optim_wrapper  # COCO Mask R-CNN, fp32
#   custom_hooks = _base_.pola_custom_hooks    # stop on a NaN / Inf loss
#
# The one source of the family's optimisers: configs/*polapp*.py take them
# with ``optim_wrapper = _base_.pola_<...>_optim_wrapper``; the schedules
# (../schedules/) set none. They are the authors' (ZacharyMeng/PolaFormerPP;
# docs/protocol.md):
# - pola_optim_wrapper: COCO Mask R-CNN (maskrcnn_b*.py), 16 images per
#   iteration; no weight decay on ``norm`` parameters (the blocks' norm1 /
#   norm2, the downsampling BatchNorms, extra_norms); the stem BatchNorms,
#   biases, the PaCS temperatures s1 / s2 and the layer scales gamma_* are
#   decayed (their other keys, 'absolute_pos_embed' and
#   'relative_position_bias_table', match no PolaPP parameter). This plain
#   wrapper also runs on a CPU.
# - pola_amp_optim_wrapper: the same with the authors' ``fp16 = dict()``,
#   fp16 autocast with a static loss scale of 512 (needs a GPU): the
#   shipped Mask / Cascade R-CNN configs.
# - pola_retinanet_optim_wrapper: their RetinaNet (retinanet_b*.py), fp16
#   too, weight decay on every parameter.
# - pola_seg_optim_wrapper: ADE20K UperNet under the PolaFormer protocol
#   (upernet_pola_swin_*: 16 images per iteration), none on ``norm``.
# - pola_ham_optim_wrapper: their ADE20K LightHamHead (polapp_b*.py over
#   schedule_160k_adamw.py; 64 images per iteration), none on ``norm``, lr
#   x10 on names containing ``head`` (the decode head); their third key,
#   'pos_block', matches no PolaPP parameter.
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
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}))
pola_amp_optim_wrapper = dict(
    pola_optim_wrapper, type='AmpOptimWrapper', loss_scale=512.)
pola_retinanet_optim_wrapper = dict(
    _delete_=True,
    type='AmpOptimWrapper',
    _scope_='mmengine',  # mmengine's own: no scope lookup, no warning
    loss_scale=512.,
    optimizer=dict(
        type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-4))
pola_seg_optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    _scope_='mmengine',  # mmengine's own: no scope lookup, no warning
    optimizer=dict(
        type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}))
pola_ham_optim_wrapper = dict(  # UperNet's optimiser, the head's lr x10
    pola_seg_optim_wrapper,
    paramwise_cfg=dict(
        custom_keys={
            'norm': dict(decay_mult=0.),
            'head': dict(lr_mult=10.),
        }))
pola_custom_hooks = [dict(type='InvalidLossHook', _scope_='mmengine')]
