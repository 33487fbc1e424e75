# Pola-PVT-M, ImageNet-1k, 8 GPUs x 64 images, grad clip 1.0.
_base_ = ['./_base_/pola_in1k_pvt.py']

model = dict(backbone=dict(arch='medium', drop_path_rate=0.3))

optim_wrapper = dict(clip_grad=dict(max_norm=1.0))
train_dataloader = dict(batch_size=64)
val_dataloader = dict(batch_size=64)
test_dataloader = val_dataloader
