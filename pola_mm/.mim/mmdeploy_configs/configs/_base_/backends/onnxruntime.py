backend_config = dict(type='onnxruntime')
