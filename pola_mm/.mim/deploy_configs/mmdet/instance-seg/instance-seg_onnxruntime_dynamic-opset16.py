# pola_mm: MMDeploy's stock instance-seg_onnxruntime_dynamic.py (shipped
# unchanged in ../../../mmdeploy_configs) at opset 16. From opset 16 on,
# MMDeploy's RoIAlign symbolic writes ONNX RoiAlign with
# coordinate_transformation_mode='half_pixel', which computes mmcv's
# aligned=True for every RoI; below 16 it shifts the RoIs and writes the
# old RoiAlign, which clamps each RoI side to at least one feature cell
# (RoIs thinner than a cell then get other features). Only two-stage
# detectors (RoIAlign) compute anything differently here.
_base_ = [
    '../../../mmdeploy_configs/configs/mmdet/instance-seg/'
    'instance-seg_onnxruntime_dynamic.py'
]
onnx_config = dict(opset_version=16)
