"""Drawing PyTorch's and the ONNX Runtime model's results with MMDeploy
(``tools/deployment/deploy.py --show-dir``)."""
import os.path as osp
from typing import Any, Dict, List, Optional, Union

from mmengine.config import Config

from .mmdeploy_export import ImageLike, load_deploy_configs, require_mmdeploy

__all__ = ['draw_results']


def draw_results(deploy_cfg: Union[str, Config],
                 model_cfg: Union[str, Config],
                 checkpoint: Optional[str],
                 onnx_file: str,
                 img: ImageLike,
                 out_dir: str,
                 device: str = 'cpu',
                 cfg_options: Optional[Dict[str, Any]] = None) -> List[str]:
    """Draw PyTorch's and the ONNX Runtime model's results on ``img`` with
    MMDeploy's ``visualize_model`` (files, no window).

    Returns:
        The image files written in ``out_dir`` (PyTorch's only with a
        ``checkpoint``: a new initialisation would draw another model).
    """
    deploy_cfg, model_cfg = load_deploy_configs(deploy_cfg, model_cfg,
                                                cfg_options)
    require_mmdeploy()
    from mmdeploy.apis import visualize_model
    from mmdeploy.utils import Backend
    files = []
    runs = [(Backend.ONNXRUNTIME, [onnx_file], 'output_onnxruntime.jpg')]
    if checkpoint is not None:  # without weights PyTorch's would differ
        runs.insert(0, (Backend.PYTORCH, checkpoint, 'output_pytorch.jpg'))
    for backend, model, name in runs:
        out = osp.join(out_dir, name)
        visualize_model(model_cfg, deploy_cfg, model, img, device,
                        backend=backend, output_file=out, show_result=False)
        files.append(out)
    return files
