"""What an ONNX export is given: the model and its inputs.

:func:`build_backbone` builds the backbone of any pola_mm config
(classifier, detector or segmentor), optionally with a checkpoint;
:func:`build_model` wraps the whole classifier, detector or segmentor of a
config as :class:`TensorModeModel`, its ``mode='tensor'`` forward on
normalised images (no data preprocessor, no post-processing: class scores,
box regressions or segmentation logits as a flat tuple);
:func:`example_inputs` makes the seeded input an export and its checks run
on. A config, checkpoint or override that cannot be used raises one
:class:`~pola_mm.deployment.onnx_errors.ExportInputError` naming the
problem and the fix.

Without a checkpoint the weights are the modules' initialisation: random.
Both builders take a ``seed`` for it (:func:`seeded`: the same seed, the
same weights, the same file), and :func:`save_state_dict` keeps them as a
checkpoint the builders read back.
"""
import contextlib
import os
import os.path as osp
from typing import Any, Iterator, List, Mapping, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from ..type_aliases import Size2
from .onnx_errors import ExportInputError, first_line

__all__ = ['TensorModeModel', 'build_backbone', 'build_model',
           'example_inputs', 'seeded', 'save_state_dict', 'weights_line']


@contextlib.contextmanager
def seeded(seed: Optional[int]) -> Iterator[None]:
    """Inside, torch's CPU random state is seeded with ``seed`` (what the
    modules' initialisation draws from); after, it is as it was. ``None``
    leaves it alone."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        yield


def weights_line(checkpoint: Optional[str], seed: Optional[int],
                 saved: Optional[str] = None,
                 hint: Optional[str] = None) -> str:
    """The one line the export and deploy tools print on every run that
    built its model, verified or refused: whether the weights are a
    checkpoint's or the random initialisation drawn from ``seed``
    (:func:`seeded`), and where they were saved (``saved``) or, for random
    ones not saved, ``hint`` (how to keep them)."""
    if checkpoint is not None:
        return (f'weights: checkpoint {checkpoint}' +
                (f', saved to {saved}' if saved else ''))
    line = f'weights: random, seeded (--seed {seed})'
    if saved:
        return f'{line}; saved to {saved}'
    return f'{line}; {hint}' if hint else line


def save_state_dict(model: nn.Module, path: str) -> str:
    """Write the weights of ``model`` (a backbone, or a
    :class:`TensorModeModel`'s whole model) to ``path`` as ``{'state_dict':
    ...}``, which :func:`build_backbone` / :func:`build_model` (and mmdet's,
    mmseg's, mmpretrain's tools for a whole model) read back. Written under
    a temporary name and moved into place.

    Returns:
        ``path``.
    """
    inner = model.model if isinstance(model, TensorModeModel) else model
    state = {k: v.detach().cpu() for k, v in inner.state_dict().items()}
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = osp.join(folder, f'.{osp.basename(path)}.tmp')
    try:
        torch.save({'state_dict': state}, tmp)
        os.replace(tmp, path)
    finally:
        if osp.exists(tmp):
            os.remove(tmp)
    return path


def _checked_config(config: Any, cfg_options: Optional[dict]) -> Any:
    """The mmengine ``Config`` of ``config`` with ``cfg_options`` merged,
    checked to have a pola_mm ``model.backbone``.

    Raises:
        ExportInputError: a missing or unreadable config file, no
            ``model.backbone``, or a backbone type pola_mm does not have.
    """
    from mmengine.config import Config

    # importing pola_mm.models (for the base class) registers the backbones
    from ..models.backbones.base import PolaBackbone
    from ..models.from_config import ConfigFileError, load_config
    from ..registry import MODELS
    name = config if isinstance(config, str) else 'the config'
    if not isinstance(config, Config):
        try:
            config = load_config(config)
        except FileNotFoundError as err:
            raise ExportInputError(f'{err}; check the path') from err
        except ConfigFileError as err:  # names the file and the cause
            raise ExportInputError(
                f'{first_line(err)}; fix the file or pass a config of '
                'pola_mm (configs/*.py)') from err
    if cfg_options:
        try:
            config.merge_from_dict(cfg_options)
        except (TypeError, KeyError, ValueError) as err:
            raise ExportInputError(
                f'--cfg-options cannot be merged into {name}: '
                f'{first_line(err)}') from err
    model_cfg = config.get('model')
    bcfg = (model_cfg.get('backbone') if isinstance(model_cfg, Mapping) else
            None)
    if not isinstance(bcfg, Mapping):
        raise ExportInputError(
            f'{name} has no model.backbone; pass a classifier, detector or '
            'segmentor config of pola_mm (configs/*.py)')
    btype = bcfg.get('type')
    btype = (btype if isinstance(btype, str) else
             getattr(btype, '__name__', str(btype)))
    short = btype[len('pola_mm.'):] if btype.startswith('pola_mm.') else btype
    backbones = sorted(k for k, cls in MODELS.module_dict.items()
                       if isinstance(cls, type)
                       and issubclass(cls, PolaBackbone))
    if short not in backbones:
        raise ExportInputError(
            f'model.backbone of {name} is {btype!r}, not a pola_mm backbone; '
            'this tool exports pola_mm backbones only: pass a config of '
            'pola_mm (configs/*.py) or set model.backbone.type to one of '
            f'{backbones}')
    return config


def build_backbone(config: Any,
                   checkpoint: Optional[str] = None,
                   cfg_options: Optional[dict] = None,
                   seed: Optional[int] = None) -> nn.Module:
    """The backbone of a pola_mm config, in eval mode.

    Args:
        config: a config file (classifier, detector or segmentor: anything
            with ``model.backbone``) or an mmengine ``Config`` (changed in
            place by ``cfg_options``).
        checkpoint: optional weights, read through the backbone's strict
            pretrained loading (:func:`pola_mm.fileio.load_checkpoint_file`,
            which never runs code from the file): the authors' file, a
            converted classifier, a detector / segmentor checkpoint or a
            backbone state dict. The config's own ``init_cfg`` is ignored
            (without ``checkpoint`` the backbone keeps its initialisation).
        cfg_options: overrides merged into the config first (e.g. a smaller
            ``model.backbone.arch``).
        seed: seeds the initialisation (:func:`seeded`; None: torch's
            current random state).

    Raises:
        ExportInputError: the config or checkpoint is missing, unreadable,
            truncated or corrupt; no ``model.backbone`` or not a pola_mm
            backbone; the backbone cannot be built from its settings; the
            checkpoint does not fit the backbone. One line naming the
            problem and the fix.
    """
    from ..fileio import CheckpointFileError
    from ..models.from_config import backbone_from_config
    cfg = _checked_config(config, cfg_options)
    name = config if isinstance(config, str) else 'the config'
    try:
        with seeded(seed):
            model, _ = backbone_from_config(cfg, checkpoint)
    except CheckpointFileError as err:
        raise ExportInputError(
            f'{first_line(err)}; pass an intact checkpoint (download or '
            'save it again), or no CKPT to export the initialised '
            'backbone') from err
    except FileNotFoundError as err:
        raise ExportInputError(f'{first_line(err)}; check the path') from err
    except (ValueError, TypeError, KeyError, AssertionError) as err:
        what = f' with checkpoint {checkpoint}' if checkpoint else ''
        fix = ('check model.backbone in the config and --cfg-options, and '
               'that the checkpoint is of the same arch' if checkpoint else
               'check model.backbone in the config and --cfg-options')
        raise ExportInputError(
            f'cannot build model.backbone of {name}{what}: '
            f'{first_line(err).rstrip(".")}; {fix}') from err
    return model


def _flat_tensors(outs: Any) -> List[Tensor]:
    """The tensors of a nested output (tensors, lists, tuples, dicts in
    key order), depth first."""
    if isinstance(outs, Tensor):
        return [outs]
    if isinstance(outs, Mapping):
        outs = [outs[k] for k in outs]
    if isinstance(outs, (list, tuple)):
        return [t for o in outs for t in _flat_tensors(o)]
    raise TypeError(f'cannot export an output of type {type(outs).__name__}')


class TensorModeModel(nn.Module):
    """A whole classifier, detector or segmentor as an exportable module:
    its ``mode='tensor'`` forward.

    Input: normalised images ``(B, C, H, W)`` (what the model's data
    preprocessor hands on: mean, std and padding are not in the graph).
    Output: the tensors of ``model(x, mode='tensor')``, flattened depth
    first into one tuple (a detector: every level's class scores, then every
    level's box regressions, ...; a segmentor: logits ``(B, K, H/4, W/4)``;
    a classifier: logits ``(B, K)``). No post-processing (NMS, resizing to
    the image) is exported.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    @property
    def in_channels(self) -> int:
        """Input channels, the backbone's."""
        return int(getattr(getattr(self.model, 'backbone', None),
                           'in_channels', 3))

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        return tuple(_flat_tensors(self.model(x, mode='tensor')))


def build_model(config: Any,
                checkpoint: Optional[str] = None,
                cfg_options: Optional[dict] = None,
                seed: Optional[int] = None) -> TensorModeModel:
    """The whole ``model`` of a pola_mm config (classifier, detector or
    segmentor, built in the config's ``default_scope``) as a
    :class:`TensorModeModel`, in eval mode.

    Args:
        config: a config file or an mmengine ``Config``.
        checkpoint: optional weights of the whole model (a Runner
            checkpoint or its state dict), read without running code from
            the file (:func:`pola_mm.fileio.load_checkpoint_file`) and
            loaded strictly. Without it the model keeps its initialisation
            (the config's ``init_cfg`` is ignored, nothing is downloaded).
        cfg_options: overrides merged into the config first.
        seed: seeds the initialisation (:func:`seeded`; None: torch's
            current random state).

    Raises:
        ExportInputError: as :func:`build_backbone`; also a config whose
            codebase (mmdet, mmseg, mmpretrain) is not installed, and a
            checkpoint whose keys or shapes do not fit the model.
    """
    from ..fileio import CheckpointFileError, load_checkpoint_file
    from ..models.checkpoint import extract_state_dict
    from ..models.from_config import build_config_model
    cfg = _checked_config(config, cfg_options)
    name = config if isinstance(config, str) else 'the config'
    try:
        with seeded(seed):
            model = build_config_model(cfg)
    except Exception as err:  # registries raise many kinds
        raise ExportInputError(
            f'cannot build the model of {name} ({type(err).__name__}: '
            f'{first_line(err).rstrip(".")}); check that its codebase '
            '(mmdet, mmseg or mmpretrain) is installed, the config and '
            '--cfg-options') from err
    if checkpoint:
        try:
            state = extract_state_dict(load_checkpoint_file(checkpoint))
            model.load_state_dict(dict(state), strict=True)
        except CheckpointFileError as err:
            raise ExportInputError(
                f'{first_line(err)}; pass an intact checkpoint') from err
        except FileNotFoundError as err:
            raise ExportInputError(
                f'{first_line(err)}; check the path') from err
        except (RuntimeError, KeyError, ValueError) as err:
            raise ExportInputError(
                f'checkpoint {checkpoint} does not fit the model of {name} '
                f'({first_line(err).rstrip(".")}); pass a checkpoint of '
                'this config, or leave out CKPT') from err
    return TensorModeModel(model).eval()


def example_inputs(model: nn.Module, shape: Size2, batch: int = 1,
                   seed: int = 0) -> Tensor:
    """A seeded ``(batch, in_channels, H, W)`` input like a normalised
    image."""
    g = torch.Generator().manual_seed(seed)
    c = int(getattr(model, 'in_channels', 3))
    return torch.randn(batch, c, int(shape[0]), int(shape[1]), generator=g)

