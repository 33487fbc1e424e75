"""Narrow compatibility fixes for the modern torch stack.

``import pola_mm`` calls :func:`apply_needed_fixes`, which applies a fix
only where the running stack fails without it (each gate is checked on the
running packages, not guessed from a version), and records what it applied
in :data:`applied`. On a stack that needs none of them, torch's
serialization allow-list and mmengine's ``Runner`` are left as they were.
The table of every fix, its upstream failure, its gate and its test is
docs/compat.md.

Applied on import, where needed (:data:`FIXES`):

1. ``'runner_checkpoints'``: ``torch.load`` defaults to
   ``weights_only=True`` (torch >= 2.6), and mmengine calls it without the
   argument. Every checkpoint an mmengine ``Runner`` saves holds a
   ``message_hub`` (``HistoryBuffer`` objects with numpy arrays, numpy
   scalars, and the buffer's statistics methods), so ``--resume`` and
   loading a checkpoint for testing fail. :func:`allow_runner_checkpoints`
   adds exactly those types (pola_mm's one allow-list,
   :func:`pola_mm.fileio.runner_checkpoint_safe_globals`) to torch's
   weights-only allow-list, which keeps refusing anything else (pickled
   code in a foreign file is still rejected). Gate:
   :func:`torch_loads_weights_only_by_default`.

2. ``'runner_compile'``: mmengine's ``compile=True`` compiles the whole
   ``model.train_step``, so dynamo also traces
   ``OptimWrapper.update_params``: the optimizer step, gradient clipping
   and mmengine's bookkeeping. With a ``paramwise_cfg`` (every Swin recipe,
   mmdet's and ours) mmengine hands the optimizer ``ConfigDict`` param
   groups, which dynamo cannot trace (``'UserDefinedDictVariable' object
   has no attribute 'items'``; mmdet's own RetinaNet fails the same way).
   :func:`patch_runner_compile` makes ``compile`` compile the model's
   computation for training (``nn.Module.compile``: data samples in,
   losses out) and leaves the data preprocessor, the optimizer step and
   the bookkeeping eager. Validation and testing stay eager, as in
   mmengine, unless the config names ``compile=dict(..., eval=True)``.
   Gate: :func:`runner_compiles_train_step`.

3. ``'mmpretrain_multimodal'``: with transformers 5 installed,
   mmpretrain 1.2.0 still imports its multimodal models, whose names
   transformers 5 removed, and ``import mmpretrain.models`` fails (so do
   ``mmdet.models`` and ``mmseg.models``). Where that would happen (checked
   on the installed transformers when mmpretrain loads), mmpretrain
   registers them as placeholders, as without transformers
   (:mod:`pola_mm.compat_mmpretrain`). Gate:
   :func:`~pola_mm.compat_mmpretrain.mmpretrain_would_fail` (both
   installed), then :func:`~pola_mm.compat_mmpretrain.missing_names`.
   The start-up hook of an installed pola_mm runs the same function when
   mmpretrain loads, so this one needs no ``import pola_mm`` first.

Not here: the two multi-process fixes the tools call for a run on CPU
with gloo (:mod:`pola_mm.cli.distributed`), which ``import pola_mm`` does
not load.

The MMDeploy fixes live with the deployment code
(:mod:`pola_mm.deployment.mmdeploy_fixes`); ``import pola_mm`` registers
them to run when MMDeploy is imported, where MMDeploy is installed.
"""
import inspect
import os
import sys
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import torch
from mmengine.model import is_model_wrapper
from mmengine.runner import Runner

from . import compat_mmpretrain
from .fileio.allow_list import (runner_checkpoint_safe_globals,
                                torch_takes_safe_globals)

__all__ = [
    'Fix', 'FIXES', 'applied', 'apply_needed_fixes', 'needed_fixes',
    'torch_loads_weights_only_by_default', 'runner_compiles_train_step',
    'allow_runner_checkpoints', 'mmdeploy_installed',
    'compile_options', 'compile_eval', 'compile_model',
    'patch_runner_compile'
]


def torch_loads_weights_only_by_default() -> bool:
    """Whether ``torch.load(f)`` without ``weights_only`` (how mmengine
    0.10.7 calls it) loads weights-only on the running torch.

    Asked of torch itself: ``torch.serialization._default_to_weights_only``
    (what ``torch.load`` consults, torch >= 2.6; older torch loads with
    pickle by default) and torch's ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` /
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` environment switches, as
    ``torch.load`` reads them.
    """
    true_values = ('1', 'y', 'yes', 'true')
    if os.getenv('TORCH_FORCE_WEIGHTS_ONLY_LOAD', '0').lower() in true_values:
        return True
    if os.getenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD',
                 '0').lower() in true_values:
        return False
    default = getattr(torch.serialization, '_default_to_weights_only', None)
    return bool(default is not None and default(None))


def allow_runner_checkpoints() -> bool:
    """Let ``torch.load(weights_only=True)`` read mmengine Runner checkpoints.

    Adds :func:`runner_checkpoint_safe_globals` to torch's allow-list; no-op
    on torch without ``add_safe_globals`` (< 2.4, where loading is not
    weights-only by default). pola_mm's own loader,
    :func:`pola_mm.fileio.load_checkpoint_file`, does not depend on it: it
    reads what torch refuses with the same allow-list through its
    restricted unpickler. ``import pola_mm`` calls this only where
    :func:`torch_loads_weights_only_by_default`. Idempotent.

    Returns:
        True if the allow-list was extended.
    """
    if not torch_takes_safe_globals():
        return False
    torch.serialization.add_safe_globals(runner_checkpoint_safe_globals())
    return True


def compile_options(compile_cfg: Any) -> Optional[dict]:
    """The ``torch.compile`` keyword arguments of a Runner's ``compile``.

    Read as mmengine reads it: ``None`` or ``False`` -> None (no
    compilation), ``True`` -> ``{}`` (torch's defaults), a dict -> a copy of
    it (``backend``, ``mode``, ``dynamic``, ``fullgraph``, ``options``)
    without pola_mm's own key ``eval`` (:func:`compile_eval`).

    Raises:
        TypeError: for any other value.
    """
    if compile_cfg is None or compile_cfg is False:
        return None
    if compile_cfg is True:
        return {}
    if isinstance(compile_cfg, dict):
        options = dict(compile_cfg)
        options.pop('eval', None)
        return options
    raise TypeError(
        f'`compile` should be a dict or bool, got {type(compile_cfg)}')


def compile_eval(compile_cfg: Any) -> bool:
    """Whether a Runner's ``compile`` opts validation and testing in.

    ``compile=dict(..., eval=True)`` (pola_mm's key, read only where
    :func:`patch_runner_compile` is applied): ``Runner.val``,
    ``Runner.test`` and the validation inside training run the model's
    forward compiled too. Anything else (``compile=True`` included) keeps
    mmengine's behaviour: only training compiles.
    """
    return isinstance(compile_cfg, dict) and bool(compile_cfg.get('eval'))


class _CompiledInTraining:
    """``module._compiled_call_impl`` of :func:`compile_model`: the
    compiled call while the module is in training mode (and in eval mode
    once ``eval`` is set), the module's eager call otherwise."""

    def __init__(self, module: torch.nn.Module, compiled: Callable,
                 eval: bool) -> None:
        self.module = module
        self.compiled = compiled
        self.eval = eval

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.module.training or self.eval:
            return self.compiled(*args, **kwargs)
        return self.module._call_impl(*args, **kwargs)


def compile_model(model: torch.nn.Module, options: dict,
                  eval: bool = False) -> bool:
    """``torch.compile`` the computation of a Runner's model, once.

    Compiles the module's call (``nn.Module.compile``) of the model inside
    any wrapper (DDP calls it), so ``train_step`` runs its forward compiled
    while the step itself -- data preprocessing, loss parsing, the
    optimizer step, logging -- stays eager. In eval mode (``val_step``,
    ``test_step``) the forward runs eager, as with mmengine's own option,
    unless ``eval`` (now or in an earlier call). ``copy.deepcopy`` (EMA
    hooks) copies the module uncompiled.

    Args:
        model: the Runner's model, wrapped or not.
        options: keyword arguments of ``torch.compile``.
        eval: compile the forward in eval mode too.

    Returns:
        True if the model was compiled now, False if it already was.
    """
    module = model.module if is_model_wrapper(model) else model
    current = getattr(module, '_compiled_call_impl', None)
    if current is not None:
        if eval and isinstance(current, _CompiledInTraining):
            current.eval = True
        return False
    module.compile(**options)
    module._compiled_call_impl = _CompiledInTraining(
        module, module._compiled_call_impl, eval)
    return True


# mmengine's Runner methods that patch_runner_compile replaced, by name
_RUNNER_ORIGINAL: dict = {}


def runner_compiles_train_step() -> bool:
    """Whether mmengine's ``Runner._maybe_compile`` is the one that
    compiles the whole ``model.train_step`` (mmengine 0.10.x, up to 0.10.7,
    the newest: ``torch.compile(getattr(self.model, target))``), and the
    running torch has ``nn.Module.compile`` (torch >= 2.1), which
    :func:`patch_runner_compile` uses instead.

    Read from the running mmengine's source, not guessed from its version;
    where the source cannot be read, mmengine <= 0.10.7 counts as compiling
    ``train_step``.
    """
    if not hasattr(torch.nn.Module, 'compile'):
        return False
    method = _RUNNER_ORIGINAL.get('_maybe_compile', Runner._maybe_compile)
    if getattr(method, '__module__', None) != 'mmengine.runner.runner':
        return False  # not mmengine's (replaced by someone else)
    try:
        return 'getattr(self.model, target)' in inspect.getsource(method)
    except (OSError, TypeError):
        import mmengine
        from mmengine.utils import digit_version
        return digit_version(mmengine.__version__) <= digit_version('0.10.7')


def _maybe_compile(self: Runner, target: str) -> None:
    """``Runner._maybe_compile`` of :func:`patch_runner_compile`."""
    compile_cfg = self.cfg.get('compile', None)
    options = compile_options(compile_cfg)
    if options is None:
        return
    evaluate = compile_eval(compile_cfg)
    if compile_model(self.model, options, evaluate):
        stages = 'training, validation and testing' if evaluate \
            else 'training (validation and testing run eager; ' \
            'compile=dict(..., eval=True) compiles them too)'
        self.logger.info(
            f'pola_mm: the model\'s forward is compiled with '
            f'torch.compile({options}) for {stages}; preprocessing and the '
            'optimizer step stay eager (pola_mm.compat). The first '
            'iterations will be slow.')


def _val(self: Runner) -> dict:
    """``Runner.val``: mmengine's, after compiling the model where the
    config opts validation in (:func:`compile_eval`)."""
    if compile_eval(self.cfg.get('compile', None)):
        self._maybe_compile('val_step')
    return _RUNNER_ORIGINAL['val'](self)


def _test(self: Runner) -> dict:
    """``Runner.test``: mmengine's, after compiling the model where the
    config opts testing in (:func:`compile_eval`)."""
    if compile_eval(self.cfg.get('compile', None)):
        self._maybe_compile('test_step')
    return _RUNNER_ORIGINAL['test'](self)


def patch_runner_compile() -> bool:
    """Make the Runner's ``compile`` option compile the model's computation.

    Replaces ``Runner._maybe_compile`` (mmengine 0.10: ``torch.compile`` of
    the whole ``model.train_step``, optimizer step included) by
    :func:`compile_model`. ``Runner.val`` / ``Runner.test`` become
    mmengine's own behind a check of ``compile=dict(..., eval=True)``:
    without that key they do what mmengine's do. ``import pola_mm`` calls
    this only where :func:`runner_compiles_train_step`. Idempotent.

    Returns:
        True if the Runner was patched now.
    """
    if _RUNNER_ORIGINAL:
        return False
    for name in ('_maybe_compile', 'val', 'test'):
        _RUNNER_ORIGINAL[name] = getattr(Runner, name)
    Runner._maybe_compile = _maybe_compile
    Runner.val = _val
    Runner.test = _test
    return True


def mmdeploy_installed() -> bool:
    """Whether MMDeploy is imported or ``import mmdeploy`` would find a
    package (without importing it): then ``import pola_mm`` registers the
    MMDeploy fixes (:mod:`pola_mm.deployment.mmdeploy_fixes`) to run when
    it is imported."""
    import importlib.util
    if 'mmdeploy.core' in sys.modules:
        return True
    try:
        return importlib.util.find_spec('mmdeploy') is not None
    except (ImportError, ValueError):  # e.g. sys.modules['mmdeploy'] = None
        return False


class Fix(NamedTuple):
    """One fix that ``import pola_mm`` applies where it is needed."""
    #: the name recorded in :data:`applied`
    name: str
    #: what fails upstream without it (one line; docs/compat.md has more)
    failure: str
    #: the gate: True where the running stack fails without the fix
    needed: Callable[[], bool]
    #: applies the fix (idempotent)
    apply: Callable[[], Any]


#: Every fix ``import pola_mm`` may apply, in order (docs/compat.md).
FIXES: List[Fix] = [
    Fix('runner_checkpoints',
        'torch.load defaults to weights_only=True (torch >= 2.6) and refuses '
        "the numpy values and HistoryBuffers of a Runner checkpoint's "
        'message_hub: --resume and tools/test.py CKPT fail',
        lambda: (torch_loads_weights_only_by_default() and
                 torch_takes_safe_globals()),
        allow_runner_checkpoints),
    Fix('runner_compile',
        "compile=True compiles the whole train_step; dynamo fails on the "
        "optimizer's ConfigDict param groups of any paramwise_cfg",
        runner_compiles_train_step, patch_runner_compile),
    Fix('mmpretrain_multimodal',
        "transformers 5 lacks names mmpretrain 1.2.0's BLIP imports: "
        'import mmpretrain.models (and mmdet.models, mmseg.models) fails '
        'with TypeError: NoneType takes no arguments',
        compat_mmpretrain.mmpretrain_would_fail, compat_mmpretrain.install),
]

#: The names of the fixes :func:`apply_needed_fixes` applied, in order.
applied: List[str] = []


def needed_fixes() -> Dict[str, bool]:
    """Each fix of :data:`FIXES` by name: whether this stack needs it."""
    return {fix.name: bool(fix.needed()) for fix in FIXES}


def apply_needed_fixes() -> List[str]:
    """Apply the fixes of :data:`FIXES` that the running stack needs (once;
    ``import pola_mm`` calls this).

    Returns:
        :data:`applied`: the names of the applied fixes.
    """
    for fix in FIXES:
        if fix.name not in applied and fix.needed():
            fix.apply()
            applied.append(fix.name)
    return applied
