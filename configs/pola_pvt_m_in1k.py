# Pola-PVT-M, ImageNet-1k, 8 GPUs x 64 images, grad clip 1.0.
_base_ = ['./_base_/pola_in1k_pvt.py']

model = dict(backbone=dict(arch='medium', drop_path_rate=0.3))

train_dataloader = dict(batch_size=64)
val_dataloader = dict(batch_size=64)
test_dataloader = val_dataloader

# lr 5e-4 per 512 images at 8 x 64 images
optim_wrapper = dict(
    optimizer=dict(lr=0.0005), clip_grad=dict(max_norm=1.0))
auto_scale_lr = dict(base_batch_size=512)
