# A tiny mmengine Runner config (model, data and metric in
# tests/compat_tiny.py; put tests/ on PYTHONPATH). Used by
# tests/test_compat.py.
custom_imports = dict(imports=['compat_tiny'], allow_failed_imports=False)
default_scope = 'mmengine'
model = dict(type='TinyRegressor')
train_dataloader = dict(
    batch_size=4,
    num_workers=0,
    dataset=dict(type='TinyRegressionDataset', length=32),
    sampler=dict(type='DefaultSampler', shuffle=True))
train_cfg = dict(type='IterBasedTrainLoop', max_iters=4, val_interval=1000)
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.05, momentum=0.9))
param_scheduler = [
    dict(type='MultiStepLR', by_epoch=False, milestones=[3], gamma=0.5)
]
test_dataloader = dict(
    batch_size=8,
    num_workers=0,
    dataset=dict(type='TinyRegressionDataset', length=16, seed=1),
    sampler=dict(type='DefaultSampler', shuffle=False))
test_cfg = dict(type='TestLoop')
test_evaluator = dict(type='TinyMSE')
default_hooks = dict(
    checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False),
    logger=dict(type='LoggerHook', interval=1))
log_processor = dict(by_epoch=False)
randomness = dict(seed=0)
