# MMDetection 1x schedule with AdamW, as used for the Pola backbones on COCO.
#
# 12 epochs, lr x0.1 after epochs 8 and 11, 500-iteration linear warm-up
# (ratio 0.001); AdamW lr 1e-4, weight decay 0.05: the Swin recipe of the
# reference protocol (Agent-Attention's agent_swin configs, which PolaFormer
# follows). No weight decay on parameters whose name contains ``norm`` or
# ``relative_position_bias_table``; everything else, biases and the polarity
# attention's ``power`` / ``scale`` / ``positional_encoding`` included, is
# decayed (see docs/protocol.md). Pola-PVT uses ./det_adamw_1x_pvt.py.
# ``auto_scale_lr``: the lr above is for 16 images per iteration (8 GPUs x 2);
# ``tools/train.py --auto-scale-lr`` rescales it linearly for other batches.
_base_ = 'mmdet::_base_/schedules/schedule_1x.py'

max_epochs = 12
train_cfg = dict(
    type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=1)

param_scheduler = [
    dict(
        type='LinearLR', start_factor=0.001, by_epoch=False, begin=0,
        end=500),
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[8, 11],
        gamma=0.1)
]

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(
        type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        custom_keys={
            'norm': dict(decay_mult=0.),
            'relative_position_bias_table': dict(decay_mult=0.),
        }))

auto_scale_lr = dict(enable=False, base_batch_size=16)
