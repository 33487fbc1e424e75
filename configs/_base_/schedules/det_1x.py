# MMDetection 1x schedule of the Pola detectors on COCO (Swin, PVT and
# PolaPP alike: the reference protocol's agent_swin / agent_pvt configs and
# the PolaPP authors' *_1x.py configs).
#
# 12 epochs, lr x0.1 after epochs 8 and 11, 500-iteration linear warm-up
# (ratio 0.001). The optimiser is not set here: each config takes its
# family's from the snippet (../models/*_train.py, ``pola_*optim_wrapper``),
# which replaces mmdet's SGD inherited below.
# ``auto_scale_lr``: the recipes' lr is for 16 images per iteration (8 GPUs
# x 2); ``tools/train.py --auto-scale-lr`` rescales it linearly for other
# batches.
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

auto_scale_lr = dict(enable=False, base_batch_size=16)
