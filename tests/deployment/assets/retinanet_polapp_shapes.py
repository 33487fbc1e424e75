# The RetinaNet of retinanet_pola_pvt_shapes.py with a tiny PolaPP backbone
# (PaCS attention in stages 1-2, rotary softmax in 3-4, layer scale in the
# last two) in place of the Pola-PVT, for the whole-model export tests. No
# weights file: the tests randomise the parameters (seeded).
_base_ = ['./retinanet_pola_pvt_shapes.py']

chans = [16, 32, 32, 64]

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaPP',
        arch=dict(embed_dims=chans, depths=[1, 1, 1, 1],
                  num_heads=[1, 2, 2, 4],
                  layer_scale_init=[None, None, 1., 1.]),
        drop_path_rate=0.0,
        out_indices=(0, 1, 2, 3),
        init_cfg=None),
    neck=dict(in_channels=chans))
