# 1x COCO schedule of the PolaFormer++ detectors (the authors' Mask R-CNN
# configs: ZacharyMeng/PolaFormerPP downstream/detection/configs/PolaPP/
# maskrcnn_b*_1x.py over their mmdet 2.x _base_/schedules/schedule_1x.py).
#
# 12 epochs, lr x0.1 after epochs 8 and 11, 500-iteration linear warm-up
# (ratio 0.001), as ./det_adamw_1x.py; AdamW lr 1e-4, betas (0.9, 0.999),
# weight decay 0.05, none on parameters whose name contains ``norm`` (the
# blocks' norm1 / norm2, the downsampling BatchNorms, extra_norms); the stem
# BatchNorms (patch_embed.proj.*), biases, the PaCS temperatures s1 / s2 and
# the layer scales gamma_* are decayed, as the authors' custom_keys give
# (their 'absolute_pos_embed' and 'relative_position_bias_table' keys match
# no PolaPP parameter and are left out). Mixed precision as the authors'
# ``fp16 = dict()``: fp16 autocast with a static loss scale of 512 (needs a
# GPU; see docs/protocol.md for a CPU / fp32 run).
# ``auto_scale_lr``: the lr is for 16 images per iteration (8 GPUs x 2).
_base_ = './det_adamw_1x.py'

optim_wrapper = dict(
    _delete_=True,
    type='AmpOptimWrapper',
    loss_scale=512.,
    optimizer=dict(
        type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}))
