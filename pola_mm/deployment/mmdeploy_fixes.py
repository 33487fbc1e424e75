"""Narrow fixes that let MMDeploy 1.3.1 export on torch >= 2.9.

MMDeploy 1.3.1 (December 2023) was written for torch 1.x / 2.0. On the torch
pola_mm installs (2.14) its ``torch2onnx`` fails for every model, mmdet's own
included, for two reasons, both fixed here and nowhere else:

1. **The default exporter.** ``torch.onnx.export`` uses the ``torch.export``
   based exporter by default since torch 2.9 (``dynamo=True``). MMDeploy's
   rewriters patch functions and symbolics for the TorchScript tracer, and
   its ``export`` calls ``torch.onnx.export`` without ``dynamo=``, so the
   export fails ("Failed to export the model with torch.export"). A function
   rewriter for ``torch.onnx.export``, registered in MMDeploy's own
   ``FUNCTION_REWRITER``, adds ``dynamo=False`` unless the caller chose.
   MMDeploy applies its rewriters only inside its ``RewriterContext``, that
   is, while its ``export`` runs: ``torch.onnx.export`` everywhere else
   (pola_mm's own :mod:`~pola_mm.deployment.pytorch2onnx` included) keeps
   torch's default. MMDeploy's stock ``*_dynamic.py`` configs (a free input
   height/width) export pola_mm's backbones too: their graphs compute
   padding, windows, masks and resized position tables from the graph's
   input size (docs/deployment.md, "Dynamic shapes").

2. **Removed symbolic helpers.** MMDeploy's ``RoIAlign`` symbolic (every
   two-stage detector: Mask R-CNN, Cascade) imports
   ``torch.onnx.symbolic_opset9._cast_Long``, which torch removed (the
   ``torch.onnx.symbolic_opset*`` modules are now thin re-exports of
   ``torch.onnx._internal.torchscript_exporter``). It is provided again as
   the same one-line symbolic torch had (``Cast`` to INT64). Two more names
   MMDeploy rewrites for other backends (``symbolic_opset11.
   _prepare_onnx_paddings`` for TensorRT, ``symbolic_opset9._generic_rnn``
   for ncnn) are still in torch's internal modules and are re-exported from
   there. Only missing names are added; nothing of torch is replaced.
   Also missing below opset 13: ``aten::unflatten``, which
   ``nn.MultiheadAttention`` now calls when query, key and value are one
   tensor (mmdet's own PVT, in its last stage), so MMDeploy's stock configs
   (opset 11) failed for mmdet's PVT models. It is registered for opsets 11
   and 12 only (torch's own symbolic serves 13 on) as the same ``Reshape``
   (:func:`provide_unflatten_below_opset13`), on every torch whose registry
   lacks it (:func:`unflatten_symbolic_missing`; torch 2.1 does too, where
   MMDeploy's stock configs failed for pola_mm's models and mmdet's PVT).

3. **torch.fx wraps made while MMDeploy exports.** MMDeploy's
   ``FunctionRewriter`` counts ``torch.fx``'s registry of wrapped functions
   when its context opens and ``pop(-1)``s what was added when it closes,
   as from a list. torch keeps that registry in a dict (keyed by module and
   name), so a module imported for the first time inside the context that
   calls ``torch.fx.wrap`` (mmpretrain's metrics, torchvision's ops, which
   the export can import lazily) ended the export with ``KeyError: -1``
   after the file was written. On such a torch MMDeploy adds no wraps of
   its own (its copy helper looks for list entries), so what was added
   belongs to those modules and is kept: the count is taken again before
   MMDeploy's restore runs (:func:`keep_fx_wraps_on_exit`).

4. **What MMDeploy's rewrites compute** (not a torch matter, but it decides
   whether UperNet, Mask R-CNN and Cascade verify): for the ONNX Runtime
   backend, rewriters of ``adaptive_avg_pool2d`` and of mmdet's RPN and
   R-CNN box heads compute what mmseg and mmdet compute where MMDeploy's
   own rewrites do not (:mod:`pola_mm.deployment.mmdeploy_rewriters`);
   they are registered here with the others.

All are applied when MMDeploy is imported (``import pola_mm`` calls
:func:`install_mmdeploy_fixes`, which waits for ``mmdeploy.core`` through
the start-up hook's post-import finder, :func:`pola_mm_startup.
after_import`; nothing of MMDeploy is imported by ``import pola_mm``, and
nothing is done where MMDeploy is not installed), or at once if it already
was. Nothing here runs the models: what mmdet's,
mmseg's and pola_mm's models compute is unchanged (the export runs their
code as MMDeploy patches it).
"""
import inspect
import threading
from types import ModuleType
from typing import Any, Dict, List, Optional

import torch

from ..compat import mmdeploy_installed

__all__ = [
    'needs_torchscript_exporter', 'provide_removed_symbolics',
    'unflatten_symbolic', 'unflatten_symbolic_missing',
    'provide_unflatten_below_opset13',
    'keep_fx_wraps_on_exit',
    'register_mmdeploy_rewriters', 'install_mmdeploy_fixes',
    'mmdeploy_installed', 'applied'
]

#: What has been applied: ``'symbolics'`` (the names added to torch's
#: modules, and ``'aten::unflatten@11'`` once that symbolic is registered)
#: ``'rewriters'`` (True once the export rewriter is registered) and
#: ``'fx_wraps'`` (True once MMDeploy's context exit keeps torch.fx wraps)
#: and ``'hook'`` (True once :func:`install_mmdeploy_fixes` registered
#: them to run when ``mmdeploy.core`` is imported).
applied: Dict[str, Any] = {'symbolics': [], 'rewriters': False,
                           'fx_wraps': False, 'hook': False}

_lock = threading.Lock()


def needs_torchscript_exporter() -> bool:
    """True when ``torch.onnx.export`` defaults to the ``torch.export``
    based exporter (torch >= 2.9: ``dynamo=True`` by default)."""
    try:
        param = inspect.signature(torch.onnx.export).parameters.get('dynamo')
    except (TypeError, ValueError):  # not introspectable
        return False
    return param is not None and param.default is True


def _cast_long(g: Any, input: Any, non_blocking: Any = False) -> Any:
    """The symbolic ``torch.onnx.symbolic_opset9._cast_Long`` had: an ONNX
    ``Cast`` of ``input`` to INT64 (``non_blocking`` is ignored, as it was).

    Args:
        g: the TorchScript ONNX graph context.
        input: the value to cast.
        non_blocking: unused (kept for the old signature).

    Returns:
        The ``Cast`` node's output.
    """
    return g.op('Cast', input, to_i=torch._C._onnx.TensorProtoDataType.INT64)


def provide_removed_symbolics() -> List[str]:
    """Add the symbolic helpers MMDeploy imports that torch removed from
    ``torch.onnx.symbolic_opset9`` / ``symbolic_opset11``.

    Only names that are missing are added (idempotent); on a torch that
    still has them nothing changes.

    Returns:
        The ``module.name`` entries added by this call.
    """
    import importlib
    internal = 'torch.onnx._internal.torchscript_exporter.'
    wanted = [
        ('torch.onnx.symbolic_opset9', '_cast_Long', lambda: _cast_long),
        ('torch.onnx.symbolic_opset9', '_generic_rnn',
         lambda: importlib.import_module(internal +
                                         'symbolic_opset9')._generic_rnn),
        ('torch.onnx.symbolic_opset11', '_prepare_onnx_paddings',
         lambda: importlib.import_module(internal + 'symbolic_opset11').
         _prepare_onnx_paddings),
    ]
    added = []
    for module_name, name, get in wanted:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, name):
            continue
        try:
            value = get()
        except (ImportError, AttributeError):
            continue  # not in this torch either: nothing to re-export
        setattr(module, name, value)
        added.append(f'{module_name}.{name}')
    applied['symbolics'].extend(added)
    return added


def unflatten_symbolic(g: Any, x: Any, dim: Any, sizes: Any) -> Any:
    """``aten::unflatten`` for the TorchScript exporter at opsets 11 and 12:
    a ``Reshape`` of ``x`` to its shape with ``dim`` replaced by ``sizes``
    (``Shape``, ``Slice`` and ``Concat`` of opset 11).

    Registered for MMDeploy's exports by
    :func:`provide_unflatten_below_opset13`, and for the duration of
    pola_mm's own TorchScript export below opset 13 by
    :func:`pola_mm.deployment.onnx_opsets.unflatten_below_opset13`.

    Args:
        g: the TorchScript ONNX graph context.
        x: the tensor to unflatten.
        dim: the dim to replace (a constant).
        sizes: the sizes that replace it (a 1-D int64 value).

    Returns:
        The ``Reshape`` node's output.
    """
    from torch.onnx import symbolic_helper as sh
    rank = sh._get_tensor_rank(x)
    if rank is None:
        return sh._unimplemented('unflatten', 'input of unknown rank')
    d = sh._get_const(dim, 'i', 'dim') % rank

    def const(v: List[int]) -> Any:
        return g.op('Constant', value_t=torch.tensor(v, dtype=torch.int64))

    shape = g.op('Shape', x)
    parts = []
    if d > 0:
        parts.append(g.op('Slice', shape, const([0]), const([d])))
    parts.append(sizes)
    if d + 1 < rank:
        parts.append(g.op('Slice', shape, const([d + 1]), const([rank])))
    return g.op('Reshape', x, g.op('Concat', *parts, axis_i=0))


def unflatten_symbolic_missing(opset: int = 11) -> bool:
    """True when the running torch's TorchScript exporter has no
    ``aten::unflatten`` symbolic for ``opset``.

    Checked in torch's own symbolic registry after torch's symbolic modules
    are imported (newer torch imports them lazily), not inferred from the
    version: torch 2.1.2 and 2.14.1 both have it from opset 13 only, and
    ``nn.MultiheadAttention`` calls ``unflatten`` in both. A torch whose
    registry is in neither known place counts as missing it (the fix then
    adds a symbolic for opsets 11 and 12 only).
    """
    import importlib
    for module in ('torch.onnx.symbolic_opset9', 'torch.onnx.symbolic_opset11',
                   'torch.onnx.symbolic_opset13'):
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    for name in ('torch.onnx._internal.torchscript_exporter.registration',
                 'torch.onnx._internal.registration'):
        try:
            registry = importlib.import_module(name).registry
        except (ImportError, AttributeError):
            continue
        return not registry.is_registered_op('aten::unflatten', opset)
    return True


def provide_unflatten_below_opset13() -> bool:
    """Register :func:`unflatten_symbolic` for opsets 11 and 12 where the
    running torch has none (:func:`unflatten_symbolic_missing`; torch's own
    serves opset 13 on, and the exporter picks the highest registered opset
    not above the target). Idempotent.

    Returns:
        True if it was registered by this call.
    """
    with _lock:
        if 'aten::unflatten@11' in applied['symbolics']:
            return False
        if not unflatten_symbolic_missing(11):
            return False
        from torch.onnx import register_custom_op_symbolic
        for opset in (11, 12):
            register_custom_op_symbolic('aten::unflatten',
                                        unflatten_symbolic, opset)
        applied['symbolics'].append('aten::unflatten@11')
    return True


def keep_fx_wraps_on_exit() -> bool:
    """Make MMDeploy's ``FunctionRewriter.exit`` keep the ``torch.fx``
    wraps registered while its context was open, where torch keeps them in
    a dict (MMDeploy pops them as from a list: ``KeyError: -1``). On a
    torch with the list nothing changes. Idempotent.

    Returns:
        True if MMDeploy's ``exit`` was wrapped by this call.
    """
    from torch.fx import _symbolic_trace
    wrapped = _symbolic_trace._wrapped_fns_to_patch
    if not isinstance(wrapped, dict):
        return False
    with _lock:
        if applied['fx_wraps']:
            return False
        from mmdeploy.core.rewriters.function_rewriter import FunctionRewriter
        restore = FunctionRewriter.exit

        def exit(self: Any) -> None:
            # what was added is the imported modules' own (see above)
            self._ori_fx_wrap_num = len(wrapped)
            restore(self)

        exit.__doc__ = restore.__doc__
        FunctionRewriter.exit = exit
        applied['fx_wraps'] = True
    return True


def _onnx_export__torchscript(*args: Any, **kwargs: Any) -> Any:
    """MMDeploy function rewriter of ``torch.onnx.export``: the TorchScript
    exporter (``dynamo=False``) unless the caller passed ``dynamo``.

    Active only inside MMDeploy's ``RewriterContext`` (its ``export``).
    """
    from mmdeploy.core import FUNCTION_REWRITER
    ctx = FUNCTION_REWRITER.get_context('torch.onnx.export')
    kwargs.setdefault('dynamo', False)
    return ctx.origin_func(*args, **kwargs)


def register_mmdeploy_rewriters(core: Optional[ModuleType] = None) -> bool:
    """Register the ONNX Runtime rewriters of
    :mod:`pola_mm.deployment.mmdeploy_rewriters` in MMDeploy's
    ``FUNCTION_REWRITER`` (on every torch: they are about what MMDeploy's
    own rewrites compute), and the ``torch.onnx.export`` rewriter where
    torch defaults to the dynamo exporter. Idempotent.

    Args:
        core: the imported ``mmdeploy.core`` (imported here if None).

    Returns:
        True once the rewriters are registered.
    """
    with _lock:
        if applied['rewriters']:
            return True
        if core is None:
            import mmdeploy.core as core
        if needs_torchscript_exporter():
            core.FUNCTION_REWRITER.register_rewriter(
                func_name='torch.onnx.export')(_onnx_export__torchscript)
        from .mmdeploy_rewriters import ONNXRUNTIME_REWRITERS
        for func_name, rewriter in ONNXRUNTIME_REWRITERS.items():
            core.FUNCTION_REWRITER.register_rewriter(
                func_name=func_name, backend='onnxruntime')(rewriter)
        applied['rewriters'] = True
    return True


def _apply(core: ModuleType) -> None:
    """The fixes, once ``mmdeploy.core`` is importable."""
    provide_removed_symbolics()
    provide_unflatten_below_opset13()
    keep_fx_wraps_on_exit()
    register_mmdeploy_rewriters(core)


def install_mmdeploy_fixes() -> str:
    """Apply the fixes now if ``mmdeploy.core`` is imported, else when it
    is, through pola_mm's one post-import mechanism
    (:func:`pola_mm_startup.after_import`). Where MMDeploy is not installed
    nothing is done (``sys.meta_path`` is left as it is). Each fix applies
    only where the running torch needs it: the exporter rewriter where
    ``torch.onnx.export`` defaults to the dynamo exporter (torch >= 2.9),
    the removed symbolic helpers where they are missing, the opset-11/12
    ``aten::unflatten`` where torch has none (checked when MMDeploy is
    imported: torch 2.1 and 2.14 both lack it), the torch.fx wraps where
    torch keeps them in a dict. ``import pola_mm`` calls this.

    Returns:
        ``'applied'``, ``'deferred'`` (waiting for ``mmdeploy.core``) or
        ``'not installed'``.
    """
    if not mmdeploy_installed():
        return 'not installed'
    from pola_mm_startup import after_import
    state = after_import('mmdeploy.core', _apply)
    applied['hook'] = True
    return state
