_base_ = ['../_base_/base_static.py', '../../_base_/backends/onnxruntime.py']
