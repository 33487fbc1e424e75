"""What the Pola backbones share: arch resolution (with drop path),
freezing, init, the stage contract with its one stage loop, the pre-norm
block."""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch.nn as nn
import torch.utils.checkpoint as cp
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from torch import Tensor

from ...ops.symbolic_sizes import contiguous
from ...type_aliases import Size2
from ..checkpoint import load_pretrained
from ..layers import Mlp
from ..layers.bricks import DropPath, build_norm_layer
from ..layers.token_map import to_map

#: Drop path of an arch dict that names none (mmdet's Swin default).
DEFAULT_DROP_PATH = 0.1


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


def arch_drop_path(arch: dict, drop_path_rate: Optional[float]) -> float:
    """The stochastic depth a backbone is built with: ``drop_path_rate``
    when given, else its arch's ``drop_path_rate`` (every ``arch_zoo``
    entry has the authors' ImageNet value), else
    :data:`DEFAULT_DROP_PATH`."""
    if drop_path_rate is not None:
        return float(drop_path_rate)
    return float(arch.get('drop_path_rate', DEFAULT_DROP_PATH))


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


def init_linear_and_norm(m: nn.Module) -> None:
    """The authors' Swin and PVT ``_init_weights``: trunc-normal (std .02)
    ``Linear`` weights with zero biases, ``LayerNorm`` ones and zeros."""
    if isinstance(m, nn.Linear):
        trunc_normal_(m.weight, std=.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        if m.weight is not None:
            nn.init.ones_(m.weight)
        if m.bias is not None:
            nn.init.zeros_(m.bias)


def check_input(x: Tensor, in_channels: int, name: str) -> None:
    """Raise a clear error unless ``x`` is a non-empty image batch
    ``(B, Cin, H, W)`` (``B, H, W >= 1``).

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
    if x.numel() == 0:
        # any H, W >= 1 works (inputs are padded to the patch size); an
        # empty batch or image would fail deep inside a conv or reshape
        raise ValueError(
            f'{name} got an empty input of shape {tuple(x.shape)}; it needs '
            'at least one image of at least 1x1 pixels (every size from 1x1 '
            'up works: see docs/inputs.md); drop empty images before the '
            'model')


class PolaBackbone(BaseModule):
    """What Pola-Swin, Pola-PVT and PolaPP share: the stage contract and its
    one stage loop (:meth:`run_stages`, run by :meth:`forward` and by the
    timm models), default init, strict pretrained loading through
    ``init_cfg``, frozen stages kept in eval mode, and the input check.

    The stage contract, on tokens ``(B, H * W, C)`` row-major on a grid
    ``hw``:

    - :meth:`stem`: image -> the first stage's tokens and grid;
    - :attr:`stages` ``[i]``: a module whose ``forward(x, hw)`` runs the
      stage's blocks, tokens in, tokens of the same grid out;
    - :meth:`downsample` ``i``: stage ``i``'s output -> stage ``i + 1``'s
      tokens and grid (patch merging, strided conv or the next patch
      embedding);
    - :meth:`out_norm` ``i``: the output norm of stage ``i`` (identity where
      the model has none).

    Subclasses set ``in_channels``, ``num_built``, ``out_indices`` and
    ``family`` (e.g. ``'Pola-Swin'``), implement the contract,
    :meth:`_freeze_stages` and :meth:`_expected_unexpected`; they may
    override :meth:`_init_layer`, :meth:`_init_extra` and
    :meth:`_expected_missing`.
    """

    family: str = 'Pola'

    def _init_layer(self, m: nn.Module) -> None:
        """The family's init of one plain layer (Linear, norm, conv),
        applied to every module: :func:`init_linear_and_norm`, the authors'
        Swin and PVT rule."""
        init_linear_and_norm(m)

    def _init_extra(self) -> None:
        """Init of the backbone's own parameters (e.g. PVT's position
        tables)."""

    def _expected_missing(self, key: str) -> bool:
        """Module keys a fitting checkpoint may lack."""
        return False

    def _expected_unexpected(self, key: str) -> bool:
        """Checkpoint keys that are fine to ignore."""
        raise NotImplementedError

    def _freeze_stages(self) -> None:
        raise NotImplementedError

    def init_weights(self) -> None:
        """Default init (the family's :meth:`_init_layer` on every module,
        each attention's own ``reset_own_parameters``, then
        :meth:`_init_extra`), then the pretrained checkpoint of
        ``init_cfg`` if any."""
        cfg = self.init_cfg if isinstance(self.init_cfg, dict) else None
        self.apply(self._init_layer)
        for m in self.modules():
            if hasattr(m, 'reset_own_parameters'):
                m.reset_own_parameters()
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

    def stem(self, x: Tensor) -> Tuple[Tensor, Size2]:
        """Image ``(B, Cin, H, W)`` -> tokens of stage 0 and their grid."""
        raise NotImplementedError

    @property
    def stages(self) -> Sequence[nn.Module]:
        """The built stage modules, in order."""
        raise NotImplementedError

    def downsample(self, i: int, x: Tensor, hw: Size2) -> Tuple[Tensor, Size2]:
        """Stage ``i``'s output tokens on ``hw`` -> stage ``i + 1``'s tokens
        and grid."""
        raise NotImplementedError

    def out_norm(self, i: int, x: Tensor) -> Tensor:
        """The output norm of stage ``i`` on its tokens (identity)."""
        return x

    def run_stages(self, x: Tensor, last: int, take: Sequence[int],
                   norm: bool = True
                   ) -> Tuple[Tensor, Size2, List[Tuple[Tensor, Size2]]]:
        """The one stage loop: :meth:`stem`, then stages ``0..last``, each
        entered through :meth:`downsample` of the one before.

        Args:
            x: images ``(B, Cin, H, W)``.
            last: the last stage to run (at most ``num_built - 1``).
            take: the stages whose outputs are returned.
            norm: return those outputs through :meth:`out_norm`.

        Returns:
            The raw tokens ``(B, H_last * W_last, C_last)`` of stage
            ``last`` with their grid, and ``(tokens, hw)`` of every stage
            in ``take``, in order.
        """
        x, hw = self.stem(x)
        taken: List[Tuple[Tensor, Size2]] = []
        for i in range(last + 1):
            if i > 0:
                x, hw = self.downsample(i - 1, x, hw)
            x = self.stages[i](x, hw)
            if i in take:
                taken.append((self.out_norm(i, x) if norm else x, hw))
        return x, hw, taken

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        """``(B, Cin, H, W)`` -> tuple of NCHW maps for ``out_indices``."""
        check_input(x, self.in_channels, type(self).__name__)
        _, _, outs = self.run_stages(x, self.num_built - 1, self.out_indices)
        return tuple(contiguous(to_map(t, hw)) for t, hw in outs)


class PreNormBlock(BaseModule):
    """Transformer block ``x + drop_path(attn(norm1(x), hw))``,
    ``x + drop_path(mlp(norm2(x)))`` with optional gradient checkpointing
    (non-reentrant). ``attn`` is any attention on ``(tokens, hw)``, built
    by the subclass (so it sits between ``norm1`` and ``norm2`` like the
    authors' blocks).
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

    def forward(self, x: Tensor, hw: Size2) -> Tensor:
        """``(B, H * W, C)`` on grid ``hw`` -> ``(B, H * W, C)``."""

        def block(x: Tensor) -> Tensor:
            x = x + self.drop_path(self.attn(self.norm1(x), hw))
            return x + self.drop_path(self.mlp(self.norm2(x)))

        if self.with_cp and x.requires_grad:
            return cp.checkpoint(block, x, use_reentrant=False)
        return block(x)
