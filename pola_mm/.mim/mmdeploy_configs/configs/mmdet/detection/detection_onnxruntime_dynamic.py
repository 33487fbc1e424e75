_base_ = ['../_base_/base_dynamic.py', '../../_base_/backends/onnxruntime.py']
