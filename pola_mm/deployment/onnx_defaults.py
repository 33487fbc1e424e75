"""What ``python -m pola_mm.deployment.pytorch2onnx`` exports when told only
the config: the input size of the config's test pipeline
(:func:`config_test_size`) and a file under ``work_dirs/`` named after the
config (:func:`default_onnx_path`).

The test size is read as OpenMMLab's own export tools read it: the last
``Resize`` ``scale`` (``(W, H)``, or one side for a square) or
``CenterCrop`` ``crop_size`` of the test pipeline, as ``(H, W)``, rounded
up to the multiple that the pipeline (``ResizeToMultiple``) or the model's
data preprocessor (``pad_size_divisor``, ``size_divisor``) pads to. A
detector's ``Resize`` with ``scale=(1333, 800)`` therefore gives 800x1344,
a classifier's ``CenterCrop`` 224 gives 224x224, a segmentor's
``scale=(2048, 512)`` 512x2048. With ``keep_ratio`` the scale is the
largest image the pipeline makes, the size a dynamic file is first checked
at; other images are smaller in one side.
"""
import os.path as osp
from typing import Any, Iterable, Mapping, Optional

from ..type_aliases import Size2
from .onnx_errors import ExportInputError, first_line

__all__ = ['config_test_size', 'default_onnx_path']


def _hw(value: Any) -> Optional[Size2]:
    """``(H, W)`` of an OpenMMLab ``scale`` / ``crop_size``: an int is a
    square, a pair is ``(W, H)``; None for anything else."""
    if isinstance(value, int):
        return value, value
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(
            isinstance(v, int) for v in value):
        return int(value[1]), int(value[0])
    return None


def _round_up(size: Size2, divisor: Any) -> Size2:
    """``size`` rounded up to a multiple of ``divisor`` (unchanged for a
    divisor that is not a positive int)."""
    if not isinstance(divisor, int) or divisor < 1:
        return size
    return tuple(-(-int(s) // divisor) * divisor for s in size)


def _test_pipeline(cfg: Any) -> Iterable[Mapping]:
    """The test pipeline of a config: its test dataloader's, else
    ``test_pipeline``, else the validation dataloader's (empty if none)."""
    for key in ('test_dataloader', 'val_dataloader'):
        loader = cfg.get(key)
        dataset = loader.get('dataset') if isinstance(loader, Mapping) \
            else None
        while isinstance(dataset, Mapping) and 'pipeline' not in dataset \
                and isinstance(dataset.get('dataset'), Mapping):
            dataset = dataset['dataset']  # wrappers (RepeatDataset, ...)
        if isinstance(dataset, Mapping) and dataset.get('pipeline'):
            return dataset['pipeline']
        if key == 'test_dataloader' and cfg.get('test_pipeline'):
            return cfg['test_pipeline']
    return []


def _type_name(transform: Mapping) -> str:
    """A transform's type without its scope (``mmdet.Resize`` ->
    ``Resize``)."""
    kind = transform.get('type')
    name = kind if isinstance(kind, str) else getattr(kind, '__name__', '')
    return name.split('.')[-1]


def _pipeline_size(pipeline: Iterable[Mapping]) -> Optional[Size2]:
    """``(H, W)`` after the test pipeline's last resize or crop, rounded up
    by its ``ResizeToMultiple``; None where no transform fixes it."""
    size = None
    for t in pipeline:
        if not isinstance(t, Mapping):
            continue
        name = _type_name(t)
        if name in ('Resize', 'ResizeEdge') and _hw(t.get('scale')):
            size = _hw(t.get('scale'))
        elif name == 'CenterCrop' and _hw(t.get('crop_size')):
            size = _hw(t.get('crop_size'))
        elif name == 'ResizeToMultiple' and size is not None:
            size = _round_up(size, t.get('size_divisor'))
    return size


def config_test_size(config: Any,
                     cfg_options: Optional[dict] = None) -> Size2:
    """``(H, W)`` of the network input the config's test pipeline makes
    (the module docstring says how it is read).

    Args:
        config: a config file or an mmengine ``Config``.
        cfg_options: overrides merged into a config read from a file.

    Raises:
        ExportInputError: the config cannot be read, or its test pipeline
            fixes no size (the message says to pass ``--shape H W``).
    """
    from ..models.from_config import ConfigFileError, load_config
    name = config if isinstance(config, str) else 'the config'
    if isinstance(config, str):
        try:
            config = load_config(config, cfg_options)
        except FileNotFoundError as err:
            raise ExportInputError(f'{err}; check the path') from err
        except ConfigFileError as err:
            raise ExportInputError(first_line(err)) from err
        except (TypeError, KeyError, ValueError) as err:
            raise ExportInputError(
                f'--cfg-options cannot be merged into {name}: '
                f'{first_line(err)}') from err
    size = _pipeline_size(_test_pipeline(config))
    if size is None:
        raise ExportInputError(
            f'cannot read the test size of {name}: its test pipeline has no '
            'Resize scale or CenterCrop crop_size; pass --shape H W')
    preprocessor = (config.get('model') or {}).get('data_preprocessor') or {}
    for key in ('pad_size_divisor', 'size_divisor'):
        size = _round_up(size, preprocessor.get(key))
    return size


def default_onnx_path(config: str, whole: bool = False) -> str:
    """The file written when ``--out`` is not given:
    ``work_dirs/<config name>/<config name>_backbone.onnx`` (``_whole``
    with ``--whole``), relative to the current folder as OpenMMLab's
    ``work_dirs``."""
    stem = osp.splitext(osp.basename(config))[0]
    part = 'whole' if whole else 'backbone'
    return osp.join('work_dirs', stem, f'{stem}_{part}.onnx')
