# A tiny Mask R-CNN with a Pola-PVT backbone for the shapes set
# (tools/misc/make_shapes_dataset.py), the two-stage detector of the
# deployment tests: the demo's Mask R-CNN (configs/demo) with the tiny
# Pola-PVT of retinanet_pola_pvt_shapes.py and a 128-wide box head. Its
# weights (mask_rcnn_pola_pvt_shapes.pth, float16) come from
#
#   python tools/misc/make_shapes_dataset.py --out data/shapes
#   python tools/train.py \
#       tests/deployment/assets/mask_rcnn_pola_pvt_shapes.py \
#       --work-dir work_dirs/mask_rcnn_shapes
#
# (400 iterations of 8 images, seed 0), state dict converted to float16.
_base_ = ['../../../configs/demo/mask_rcnn_pola_swin_shapes.py']

chans = [16, 32, 64, 64]

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaPVT',
        arch=dict(embed_dims=chans, depths=[1, 1, 1, 1],
                  num_heads=[1, 2, 2, 4], mlp_ratios=[2, 2, 2, 2],
                  sr_ratios=[8, 4, 2, 1]),
        pretrain_img_size=128,
        drop_path_rate=0.0,
        out_indices=(0, 1, 2, 3),
        init_cfg=None),
    neck=dict(in_channels=chans),
    roi_head=dict(bbox_head=dict(fc_out_channels=128)))
