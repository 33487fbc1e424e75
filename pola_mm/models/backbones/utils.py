"""Helpers shared by the Pola backbones: arch resolution, freezing, init."""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks import DropPath
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from torch import Tensor

from ..checkpoint import load_pretrained
from ..layers import Mlp, PolarityAttention, WindowMSA
from ..layers.polarity_kernel import cpu_autocast_enabled, cpu_inference

Size2 = Tuple[int, int]

#: At inference on CPU the feed-forward half of a block runs on runs of
#: tokens whose hidden activations hold about this many elements (4 MiB in
#: float32), so that the hidden layer stays in cache between ``fc1``, the
#: activation and ``fc2``, and no step allocates (and page-faults) a fresh
#: full-size hidden tensor. Measured on a 2-core CPU: stage-1 MLPs of
#: Pola-Swin-T at 800x1344 went from 124 to 63 ms, Pola-PVT-T's at
#: 1600x2688 from 585 to 251 ms; 2^19 to 2^21 were within 10% of each other.
FFN_CHUNK_ELEMENTS = 1 << 20
#: ... but never fewer tokens than this per run (wide late stages).
_FFN_MIN_TOKENS = 1024
#: At inference on CPU, polarity attention over a stage map runs on runs of
#: grid rows whose ``(tokens, C)`` maps hold about this many elements (keys
#: first, then queries; see :meth:`PolarityAttention.forward_in_runs`), so
#: that its intermediates stay the same small size at every stage and image
#: size instead of growing with the image.
RUN_ELEMENTS = 1 << 19


def pair(x: Union[int, Sequence[int]]) -> Size2:
    """``int -> (int, int)``; sequences are returned as a pair of ints."""
    if isinstance(x, int):
        return (x, x)
    return (int(x[0]), int(x[1]))


def linspace(end: float, num: int) -> List[float]:
    """``num`` values evenly spaced over ``[0, end]`` (stochastic depth
    rates; plain Python so building works on any default device)."""
    if num == 1:
        return [0.0]
    return [end * i / (num - 1) for i in range(num)]


def resolve_arch(arch: Union[str, dict], zoo: Dict[str, dict],
                 keys: Sequence[str], cls: type) -> dict:
    if isinstance(arch, str):
        name = arch.lower()
        if name not in zoo:
            raise ValueError(f'{cls.__name__}: unknown arch {arch!r}; valid '
                             f'names are {sorted(zoo)} or a dict with keys '
                             f'{list(keys)}')
        return dict(zoo[name])
    if not isinstance(arch, dict):
        raise TypeError(f'{cls.__name__}: arch must be a name '
                        f'{sorted(zoo)} or a dict, got {type(arch).__name__}')
    missing = [k for k in keys if k not in arch]
    if missing:
        raise KeyError(f'{cls.__name__}: arch dict is missing {missing}; '
                       f'required keys are {list(keys)}')
    return dict(arch)


def check_out_indices(out_indices: Union[int, Sequence[int]],
                      num_stages: int) -> Tuple[int, ...]:
    if isinstance(out_indices, int):
        out_indices = (out_indices, )
    out = []
    for i in out_indices:
        j = i + num_stages if i < 0 else i
        if not 0 <= j < num_stages:
            raise ValueError(f'out_indices {tuple(out_indices)} must lie in '
                             f'[0, {num_stages})')
        out.append(j)
    if not out:
        raise ValueError('out_indices must not be empty')
    return tuple(sorted(set(out)))


def freeze(module: nn.Module) -> None:
    module.eval()
    for p in module.parameters():
        p.requires_grad = False


def init_module(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        trunc_normal_(m.weight, std=.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        if m.weight is not None:
            nn.init.ones_(m.weight)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, PolarityAttention):
        nn.init.zeros_(m.power)
        nn.init.zeros_(m.scale)
        nn.init.zeros_(m.positional_encoding)
    elif isinstance(m, WindowMSA):
        trunc_normal_(m.relative_position_bias_table, std=.02)


def check_input(x: Tensor, in_channels: int, name: str) -> None:
    """Raise a clear error unless ``x`` is an image batch ``(B, Cin, H, W)``.

    Args:
        x: the backbone input.
        in_channels: the ``Cin`` the backbone was built with.
        name: the backbone's class name, for the message.
    """
    if x.dim() != 4 or x.shape[1] != in_channels:
        raise ValueError(
            f'{name} expects images of shape (B, {in_channels}, H, W), got '
            f'{tuple(x.shape)}; add a batch dimension, or build the backbone '
            f'with in_channels={x.shape[1] if x.dim() == 4 else "C"}')


class PolaBackbone(BaseModule):
    """What Pola-Swin and Pola-PVT share: default init, strict pretrained
    loading through ``init_cfg``, frozen stages kept in eval mode, and the
    input check.

    Subclasses set ``in_channels`` and ``family`` (e.g. ``'Pola-Swin'``) and
    implement :meth:`_freeze_stages` and :meth:`_expected_unexpected`; they
    may override :meth:`_init_extra` and :meth:`_expected_missing`.
    """

    family: str = 'Pola'

    def _init_extra(self) -> None:
        """Init beyond :func:`init_module` (e.g. learned position tables)."""

    def _expected_missing(self, key: str) -> bool:
        """Module keys a fitting checkpoint may lack."""
        return False

    def _expected_unexpected(self, key: str) -> bool:
        """Checkpoint keys that are fine to ignore."""
        raise NotImplementedError

    def _freeze_stages(self) -> None:
        raise NotImplementedError

    def init_weights(self) -> None:
        """Default init (trunc-normal Linear, zero ``power``/``scale``/
        ``positional_encoding`` as the authors, :meth:`_init_extra`), then
        the pretrained checkpoint of ``init_cfg`` if any."""
        cfg = self.init_cfg if isinstance(self.init_cfg, dict) else None
        self.apply(init_module)
        self._init_extra()
        if cfg is not None and cfg.get('type') == 'Pretrained':
            load_pretrained(
                self, cfg['checkpoint'], self._expected_missing,
                self._expected_unexpected,
                f'a {self.family} checkpoint of the same arch (the authors\' '
                'file or one converted by tools/model_converters/'
                'pola_official_to_mm.py)', prefix=cfg.get('prefix'))
        elif self.init_cfg is not None:
            super().init_weights()
        self._is_init = True

    def train(self, mode: bool = True) -> 'PolaBackbone':
        """Set the mode; frozen stages stay in eval mode."""
        super().train(mode)
        self._freeze_stages()
        return self

    def check_input(self, x: Tensor) -> None:
        """Raise a clear error unless ``x`` is ``(B, in_channels, H, W)``."""
        check_input(x, self.in_channels, type(self).__name__)


class PreNormBlock(BaseModule):
    """Transformer block ``x + drop_path(attn(norm1(x)))``,
    ``x + drop_path(mlp(norm2(x)))`` with optional gradient checkpointing.

    Subclasses build their attention module, pass it in (so ``attn`` sits
    between ``norm1`` and ``norm2`` like the authors' blocks) and implement
    :meth:`_attend`.
    """

    def __init__(self, embed_dims: int, attn: nn.Module, mlp_ratio: float,
                 drop_rate: float, drop_path_rate: float, act_cfg: dict,
                 norm_cfg: dict, with_cp: bool,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.with_cp = with_cp
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.attn = attn
        self.drop_path = (DropPath(drop_path_rate)
                          if drop_path_rate > 0 else nn.Identity())
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.mlp = Mlp(embed_dims, int(embed_dims * mlp_ratio), act_cfg,
                       drop_rate)

    def _attend(self, x: Tensor, hw: Size2) -> Tensor:
        """Attention on normalised tokens ``(B, H * W, C)`` on grid ``hw``."""
        raise NotImplementedError

    def _forward(self, x: Tensor, hw: Size2) -> Tensor:
        rows = max(1, RUN_ELEMENTS // (hw[1] * x.shape[-1]))
        if (isinstance(self.attn, PolarityAttention) and rows < hw[0]
                and not self.training
                and x.dtype in (torch.float32, torch.float64)
                and not cpu_autocast_enabled()
                and self._cpu_inference(x, self.norm1, self.attn)):
            # CPU inference: the attention half in runs of rows (the same
            # result), the residual written by it, and the feed-forward
            # half added in place
            x = self.attn.forward_in_runs(x, hw, rows, norm=self.norm1,
                                          residual=True)
            return self._ffn(x, inplace=True)
        x = x + self.drop_path(self._attend(self.norm1(x), hw))
        return self._ffn(x)

    def _ffn(self, x: Tensor, inplace: bool = False) -> Tensor:
        """``x + drop_path(mlp(norm2(x)))``, in runs of tokens when nothing
        needs a gradient on CPU (see :data:`FFN_CHUNK_ELEMENTS`); with
        ``inplace`` (for a contiguous ``x`` the block itself made), the runs
        are added into ``x``."""
        C = x.shape[-1]
        step = max(FFN_CHUNK_ELEMENTS // self.mlp.fc1.out_features,
                   _FFN_MIN_TOKENS)
        if (self.training or x.numel() <= step * C
                or not self._cpu_inference(x, self.norm2, self.mlp)):
            return x + self.drop_path(self.mlp(self.norm2(x)))
        # eval mode: drop_path and dropout are identities, every token is
        # independent
        flat = x.view(-1, C) if inplace else x.reshape(-1, C)
        out = flat if inplace else torch.empty_like(flat)
        fused = (not cpu_autocast_enabled()
                 and self.mlp.fc1.weight.dtype == x.dtype)
        hidden = (flat.new_empty(step, self.mlp.fc1.out_features)
                  if fused else None)
        scratch = flat.new_empty(step, C) if fused and inplace else None
        for i in range(0, flat.shape[0], step):
            t, o = flat[i:i + step], out[i:i + step]
            if hidden is None:
                o.copy_(t + self.mlp(self.norm2(t)))
            elif scratch is None:  # one hidden buffer for every run
                self.mlp.forward_into(self.norm2(t), o, hidden)
                o.add_(t)
            else:
                y = scratch[:t.shape[0]]
                self.mlp.forward_into(self.norm2(t), y, hidden)
                t.add_(y)
        return out.view(x.shape)

    @staticmethod
    def _cpu_inference(x: Tensor, *modules: nn.Module) -> bool:
        """See :func:`~..layers.polarity_kernel.cpu_inference`."""
        return cpu_inference(x, *modules)

    def forward(self, x: Tensor, hw: Size2) -> Tensor:
        """``(B, H * W, C)`` on grid ``hw`` -> ``(B, H * W, C)``."""
        if self.with_cp and x.requires_grad:
            return cp.checkpoint(self._forward, x, hw, use_reentrant=False)
        return self._forward(x, hw)
