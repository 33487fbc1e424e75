# MMDetection 3x schedule of the Pola detectors on COCO (the Swin recipe's
# and the PolaPP authors' *_3x.py).
#
# 36 epochs, lr x0.1 after epochs 27 and 33, 500-iteration linear warm-up;
# otherwise as det_1x.py (no optimiser: the snippet's). Pair it with
# the multi-scale + random-crop training pipeline of
# ../datasets/coco_instance_ms_crop.py.
_base_ = './det_1x.py'

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)

param_scheduler = [
    dict(
        type='LinearLR', start_factor=0.001, by_epoch=False, begin=0,
        end=500),
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[27, 33],
        gamma=0.1)
]
