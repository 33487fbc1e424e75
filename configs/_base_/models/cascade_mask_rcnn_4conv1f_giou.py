# Cascade Mask R-CNN with the box heads of the Swin detection recipe, as the
# Agent-Attention protocol followed by PolaFormer uses them: in each of the
# three stages 4 shared 3x3 convs (SyncBN) + 1 fc ("4conv1f"), class-specific
# regression of decoded boxes with a GIoU loss of weight 10. Everything else
# (RPN, RoI extractors, mask head, assigners, test settings) is mmdet's own
# cascade-mask-rcnn_r50_fpn.py. The backbone and the FPN's input channels come
# from a pola_*_fpn.py snippet.
_base_ = 'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py'


model = dict(
    roi_head=dict(bbox_head=[
        dict(
            type='Shared4Conv1FCBBoxHead',
            in_channels=256,
            conv_out_channels=256,
            fc_out_channels=1024,
            roi_feat_size=7,
            num_classes=80,
            bbox_coder=dict(
                type='DeltaXYWHBBoxCoder',
                target_means=[0., 0., 0., 0.],
                target_stds=stds),
            reg_class_agnostic=False,
            reg_decoded_bbox=True,
            norm_cfg=dict(type='SyncBN', requires_grad=True),
            loss_cls=dict(
                type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
            loss_bbox=dict(type='GIoULoss', loss_weight=10.0))
        # the three stages differ only in their regression target stds
        for stds in ([0.1, 0.1, 0.2, 0.2], [0.05, 0.05, 0.1, 0.1],
                     [0.033, 0.033, 0.067, 0.067])
    ]))
