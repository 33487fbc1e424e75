# MMDetection 1x schedule with AdamW for the Pola-PVT detectors.
#
# As ./det_adamw_1x.py (12 epochs, steps 8 / 11, 500-iteration warm-up), but
# weight decay 1e-4 on every parameter: the reference protocol's PVT configs
# (Agent-Attention agent_pvt/*) set no paramwise_cfg, so norms, biases and
# position tables are decayed too. lr 1e-4 (RetinaNet); the Mask R-CNN
# configs set 2e-4.
_base_ = './det_adamw_1x.py'

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(
        type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-4))
