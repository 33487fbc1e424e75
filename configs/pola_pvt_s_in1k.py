# Pola-PVT-S, ImageNet-1k, 8 GPUs x 64 images.
_base_ = ['./_base_/pola_in1k_pvt.py']

model = dict(backbone=dict(arch='small', drop_path_rate=0.1))

train_dataloader = dict(batch_size=64)
val_dataloader = dict(batch_size=64)
test_dataloader = val_dataloader
