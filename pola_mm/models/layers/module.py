"""The base class of pola_mm's layers and backbones.

:class:`PolaModule` is mmengine's ``BaseModule`` (``init_cfg``,
``init_weights``) with two additions:

- :meth:`PolaModule.select_path`, the one place a module asks
  :func:`pola_mm.ops.dispatch.select` which fast paths its call may use;
- what ``torch.jit.script`` needs to compile the module (the timm models
  of :mod:`pola_mm.timm` compile whole). Compiled code runs the plain
  formula, the one that exports and ``torch.compile`` see:
  ``select_path`` gives it the plain ``Path()``. TorchScript compiles
  every branch of a method except those it decides while compiling, so
  the code beside the plain formula (fast kernels, runs of tokens,
  autocast islands, caches) is either in a block under
  ``if not torch.jit.is_scripting():`` (left out of compiled code) or in a
  function or method marked ``@torch.jit.unused`` (compiled as a stub
  that raises; its branch is never taken there), and attributes that
  exist in one configuration only are tested with ``hasattr(self, name)``
  (decided while compiling).
"""
import torch
from mmengine.model import BaseModule
from torch import Tensor

from ...ops import dispatch
from ...ops.dispatch import Path

__all__ = ['PolaModule']


class PolaModule(BaseModule):
    """``BaseModule`` that TorchScript compiles (see the module docstring).

    mmengine's ``is_init`` property (a getter with a setter, which
    TorchScript cannot compile) is left out of compiled modules.
    """

    __jit_unused_properties__ = ['is_init']

    def select_path(self, x: Tensor) -> Path:
        """The fast paths this call on input ``x`` may use
        (:func:`pola_mm.ops.dispatch.select` with this module's parameters);
        the plain ``Path()`` in compiled (TorchScript) code."""
        if torch.jit.is_scripting():
            return Path()
        return self._select_path(x)

    @torch.jit.unused
    def _select_path(self, x: Tensor) -> Path:
        return dispatch.select(x, self)
