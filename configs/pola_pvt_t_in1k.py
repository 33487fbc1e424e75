# Pola-PVT-T, ImageNet-1k, 8 GPUs x 128 images.
_base_ = ['./_base_/pola_in1k_pvt.py']

model = dict(backbone=dict(arch='tiny', drop_path_rate=0.1))
