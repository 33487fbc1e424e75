# Pola-Swin-B: backbone plus the channels of the neck / head after it.
#
# A snippet for MMDetection / MMSegmentation configs (pola_mm installed: its
# start-up hook lets any tool, upstream's train.py and mim included, resolve
# pola_mm::).
# List it next to a complete upstream config, then plug its pieces in:
#
#   _base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
#             'pola_mm::_base_/models/pola_swin_b_fpn.py']
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
# ImageNet-1k weights: checkpoints/pola_swin_b_in1k.pth under the working
# directory, or $POLA_PRETRAINED/pola_swin_b_in1k.pth if that variable is set.
# The authors' released file or an mmpretrain checkpoint of
# configs/pola_swin_b_in1k.py both load.
#
# Drop path 0.4: the reference's detection value for Pola-Swin-B (Mask R-CNN
# and Cascade Mask R-CNN, 1x and 3x); the UperNet config uses 0.5.
# (Agent-Attention's downstream configs, which PolaFormer's protocol
# follows; docs/protocol.md.)
# optimisers and the NaN / Inf stop of the family: ./pola_swin_train.py
_base_ = './pola_swin_train.py'

custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

pola_pretrained = '{{$POLA_PRETRAINED:checkpoints}}/pola_swin_b_in1k.pth'
pola_channels = [128, 256, 512, 1024]
pola_backbone = dict(
    _delete_=True,
    type='PolaSwinTransformer',
    arch='base',
    pretrain_img_size=224,
    window_size=56,
    attn_layout='LLSS',
    drop_path_rate=0.4,
    out_indices=(0, 1, 2, 3),
    frozen_stages=-1,
    with_cp=False,
    init_cfg=dict(type='Pretrained', checkpoint=pola_pretrained))
pola_neck = dict(in_channels=pola_channels)
# ADE20K (UperNet), the reference's drop path:
#   backbone=dict(_base_.pola_backbone,
#                 drop_path_rate=_base_.pola_seg_drop_path)
pola_seg_drop_path = 0.5
