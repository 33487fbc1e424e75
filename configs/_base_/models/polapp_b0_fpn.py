# PolaFormer++ PolaPP-b0: backbone plus the channels of the neck / head
# after it.
#
# A snippet for MMDetection / MMSegmentation configs (pola_mm installed: its
# start-up hook lets any tool, upstream's train.py and mim included, resolve
# pola_mm::).
# List it next to a complete upstream config, then plug its pieces in:
#
#   _base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
#             'pola_mm::_base_/models/polapp_b0_fpn.py']
#   model = dict(backbone=_base_.pola_backbone, neck=_base_.pola_neck)
#   optim_wrapper = _base_.pola_optim_wrapper  # AdamW, as the reference
#   custom_hooks = _base_.pola_custom_hooks    # stop on a NaN / Inf loss
#
# MMSegmentation: decode_head=dict(in_channels=_base_.pola_channels); the
# authors' LightHamHead on stages 2-4 is configs/_base_/polapp_ham_ade20k.py.
# (Sibling bases may not share keys, hence ``pola_*`` variables rather than
# a ``model`` dict.)
#
# Drop path 0.1: the authors' value for b0 (their model definition POLA_b0;
# they publish no downstream config for b0). The BatchNorms of the stem and of the
# downsampling layers are kept in eval mode (``norm_eval=True``, the
# OpenMMLab convention and the authors' segmentation code); the authors'
# detection code leaves them in training mode, so the configs/*polapp*
# detectors set ``norm_eval=False`` (docs/protocol.md).
#
# ImageNet-1k weights: checkpoints/polapp_b0_in1k.pth under the working
# directory, or $POLA_PRETRAINED/polapp_b0_in1k.pth if that variable is set
# (the authors' released classifier file).
# optimisers and the NaN / Inf stop of the family: ./polapp_train.py
_base_ = './polapp_train.py'

custom_imports = dict(imports=['pola_mm'], allow_failed_imports=False)

pola_pretrained = '{{$POLA_PRETRAINED:checkpoints}}/polapp_b0_in1k.pth'
pola_channels = [32, 64, 128, 384]
pola_backbone = dict(
    _delete_=True,
    type='PolaPP',
    arch='b0',
    drop_path_rate=0.1,
    out_indices=(0, 1, 2, 3),
    frozen_stages=-1,
    norm_eval=True,
    with_cp=False,
    init_cfg=dict(type='Pretrained', checkpoint=pola_pretrained))
pola_neck = dict(in_channels=pola_channels)
