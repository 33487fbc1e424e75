# PolaFormer++ PolaPP on ImageNet-1k: the authors' recipe as their public
# code states it (ZacharyMeng/PolaFormerPP polaformer++/: config.py defaults,
# cfgs/pola_b*.yaml, main_ema.py, pretrain.sh, optimizer.py,
# lr_scheduler.py, data/build.py; point by point in docs/protocol.md).
#
# Shared with PolaFormer (those files are identical there, and are
# ./pola_in1k_runtime.py): AdamW (eps 1e-8, betas 0.9 / 0.999), lr 5e-4 per
# 512 images with warm-up start and minimum lr scaled alike; no weight decay
# on 1-D parameters and biases (the PaCS temperatures s1 / s2 and the layer
# scales gamma_* are decayed); linear warm-up and cosine stepped per
# iteration; random resized crop, flip, RandAugment rand-m9-mstd0.5-inc1,
# random erasing 0.25, Mixup 0.8 / CutMix 1.0, label smoothing 0.1;
# evaluation resizes to a 256x256 square and centre-crops 224; fp32.
# PolaFormer++ adds an EMA of the weights (main_ema.py, pretrain.sh
# --model-ema-decay 0.99982): updated every iteration, buffers included;
# validation and checkpoints use the averaged weights.
#
# This base holds the b1-b3 schedule (cfgs/pola_b{1,2,3}.yaml: 300 epochs,
# 20 warm-up epochs from WARMUP_LR 5e-7, cosine to MIN_LR 1e-7, i.e. ratios
# 1e-3 and 2e-4 of BASE_LR 5e-4; grad clip 5.0; weight decay 0.05); b4 and
# b5 set their own. Batch, lr and drop path are set per model.
#
# The classifier is the authors' (models/pola.py, POLA): the last stage's
# raw output (no extra_norms: with_extra_norms=False), a 1x1 conv to 2048
# channels (2560 for b5), BatchNorm, Swish, average pooling (pola_mm's
# PolaPPClsNeck, parameters neck.proj / neck.norm) and a linear head (their
# 1x1-conv head on the pooled map; head.fc). Their ImageNet files load after
# tools/model_converters/pola_official_to_mm.py (load_from=...).
_base_ = ['./pola_in1k_runtime.py']

model = dict(
    backbone=dict(
        _delete_=True, type='PolaPP', arch='b2', out_indices=(3, ),
        with_extra_norms=False, drop_path_rate=0.1),
    neck=dict(
        _delete_=True, type='PolaPPClsNeck', in_channels=512,
        out_channels=2048),
    head=dict(in_channels=2048))

optim_wrapper = dict(clip_grad=dict(max_norm=5.0))

train_cfg = dict(max_epochs=300)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=20,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min_ratio=2e-4, by_epoch=True,
         begin=0, end=300, convert_to_iter_based=True),
]

# timm ModelEma(decay=0.99982) over state_dict(): mmengine's momentum is
# 1 - decay, and buffers (BatchNorm statistics) are averaged too.
custom_hooks = [
    dict(type='EMAHook', momentum=1.8e-4, update_buffers=True,
         priority='ABOVE_NORMAL')
]
