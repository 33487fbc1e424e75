# Mask R-CNN, Pola-Swin-T backbone with PolaFormer++'s PaCS feature map,
# COCO instance segmentation, 1x schedule: an example of
# ``feature_map='pacs'`` downstream.
#
# Everything as mask_rcnn_pola_swin_t.py (12 epochs, multi-scale + random
# crop, AdamW lr 1e-4, weight decay 0.05 except norms and relative position
# bias tables, drop path 0.1, 2 images per GPU x 8 GPUs), with the PaCS
# variant's ImageNet weights: checkpoints/pola_swin_t_pacs_in1k.pth (or
# $POLA_PRETRAINED/pola_swin_t_pacs_in1k.pth), a checkpoint of
# configs/pola_swin_t_pacs_in1k.py (nobody publishes one; train it first).
_base_ = ['./mask_rcnn_pola_swin_t.py']

model = dict(
    backbone=dict(
        feature_map='pacs',
        init_cfg=dict(
            type='Pretrained',
            checkpoint='{{$POLA_PRETRAINED:checkpoints}}/'
            'pola_swin_t_pacs_in1k.pth')))
