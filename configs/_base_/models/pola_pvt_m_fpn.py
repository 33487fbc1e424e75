# Pola-PVT-M: backbone plus the channels of the neck / head after it.
#
# A snippet for MMDetection / MMSegmentation configs (pola_mm installed: its
# start-up hook lets any tool, upstream's train.py and mim included, resolve
# pola_mm::).
# List it next to a complete upstream config, then plug its pieces in:
#
#   _base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
#             'pola_mm::_base_/models/pola_pvt_m_fpn.py']
#   model = dict(backbone=_base_.pola_backbone, neck=_base_.pola_neck)
#   optim_wrapper = _base_.pola_optim_wrapper  # AdamW, as the reference
#   custom_hooks = _base_.pola_custom_hooks    # stop on a NaN / Inf loss
#
# MMSegmentation UperNet instead:
#   decode_head=dict(in_channels=_base_.pola_channels),
#   auxiliary_head=dict(in_channels=_base_.pola_channels[2])
# (Sibling bases may not share keys, hence ``pola_*`` variables rather than
# a ``model`` dict.)
#
# ImageNet-1k weights: checkpoints/pola_pvt_m_in1k.pth under the working
# directory, or $POLA_PRETRAINED/pola_pvt_m_in1k.pth if that variable is set.
# The authors' released file or an mmpretrain checkpoint of
# configs/pola_pvt_m_in1k.py both load.
#
# Drop path 0.1: the reference's Mask R-CNN value for Pola-PVT-M; its
# RetinaNet and the Semantic FPN configs use 0.2.
# (Agent-Attention's downstream configs, which PolaFormer's protocol
# follows; docs/protocol.md.)
# optimisers and the NaN / Inf stop of the family: ./pola_pvt_train.py
_base_ = './pola_pvt_train.py'

custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

pola_pretrained = '{{$POLA_PRETRAINED:checkpoints}}/pola_pvt_m_in1k.pth'
pola_channels = [64, 128, 320, 512]
pola_backbone = dict(
    _delete_=True,
    type='PolaPVT',
    arch='medium',
    pretrain_img_size=224,
    attn_layout='LLLL',
    drop_path_rate=0.1,
    out_indices=(0, 1, 2, 3),
    frozen_stages=-1,
    with_cp=False,
    init_cfg=dict(type='Pretrained', checkpoint=pola_pretrained))
pola_neck = dict(in_channels=pola_channels)
# RetinaNet, the reference's drop path:
#   backbone=dict(_base_.pola_backbone,
#                 drop_path_rate=_base_.pola_retinanet_drop_path)
pola_retinanet_drop_path = 0.2
# ADE20K (Semantic FPN), the reference's drop path:
#   backbone=dict(_base_.pola_backbone,
#                 drop_path_rate=_base_.pola_seg_drop_path)
pola_seg_drop_path = 0.2
