# Pola-Swin-T with PolaFormer++'s PaCS feature map, ImageNet-1k, 8 GPUs x
# 128 images: an example of ``feature_map='pacs'``.
#
# The polarity stages use PaCS (``exp(t * x) - 1`` per channel, separate
# learned temperatures for the same-signed and opposite-signed flows,
# sigmoid-normalised and zero-initialised) instead of the shared learnable
# power; the model is otherwise Pola-Swin-T and the recipe is
# pola_swin_t_in1k.py's unchanged (the authors' PolaFormer ImageNet recipe:
# AdamW lr 1e-3 for 1024 images, weight decay 0.05 on all but 1-D
# parameters, biases and relative position bias tables, 300 epochs, drop
# path 0.2, grad clip 5.0). Trained from scratch: the authors publish no
# weights for this combination, and no accuracy for it is known.
_base_ = ['./pola_swin_t_in1k.py']

model = dict(backbone=dict(feature_map='pacs'))
