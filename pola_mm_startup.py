"""pola_mm's start-up hook: the two things a config file cannot do for
itself, done in programs that never import pola_mm.

Installing pola_mm (a wheel or ``pip install -e``) puts
``pola_mm_startup.pth`` into site-packages (``setup.py`` writes it); Python
runs its line, ``import pola_mm_startup; pola_mm_startup.install()``, at
every start. :func:`install` imports nothing (this module uses ``sys`` and
``os`` only, both loaded by then) and puts :class:`PostImportFinder` first
on ``sys.meta_path``. The finder answers ``None`` to every import after one
dictionary look-up, except for three modules, which the other finders load
and the finder then completes (:data:`PATCHES`):

* ``mmengine.config.config``: ``Config._get_cfg_path`` (how mmengine
  turns a ``_base_`` entry into a file) hands every entry to mmengine
  unchanged, except the ``pola_mm::`` ones (:func:`wrap_get_cfg_path`).
  The first of those registers the scope (:func:`register_config_scope`:
  ``'pola_mm'`` joins ``MODULE2PACKAGE``, and the reader's
  ``get_installed_path`` answers pola_mm's folder for it). So mmdet's,
  mmseg's and mmpretrain's own ``tools/train.py``, ``mim train`` and any
  script read a config whose ``_base_`` names ``pola_mm::...``: the
  upstream tools resolve ``_base_`` before they import the config's
  ``custom_imports``. A program that reads no such entry sees
  ``MODULE2PACKAGE`` and ``get_installed_path`` as mmengine made them.
* ``mim.utils`` (openmim), only where mim's own
  ``get_installed_path('pola_mm')`` is not pola_mm's folder (an editable
  install): it answers the folder for ``'pola_mm'``, so ``mim search
  pola_mm`` finds the model index; every other package is mim's answer.
* ``mmpretrain.utils.dependency``, only where transformers >= 5 is
  installed beside mmpretrain and lacks a name that mmpretrain 1.2.0's
  multimodal models import (their import would break ``import
  mmpretrain.models``, ``mmdet.models`` and ``mmseg.models``): those models
  become placeholders (:func:`fix_mmpretrain_multimodal`).

``POLA_MM_STARTUP_HOOK=0`` (or ``false``, ``off``, ``no``) turns the hook
off; ``pip uninstall pola_mm`` removes it. ``import pola_mm`` does the same
registration itself, and waits for modules through :func:`after_import`.
docs/install.md ("the start-up hook") says what it changes and why.
"""
from __future__ import annotations
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: nothing is imported at start-up
    from types import ModuleType
    from typing import Callable

__all__ = ['MULTIMODAL_IMPORTS', 'PATCHES', 'PostImportFinder', 'SWITCH',
           'after_import', 'complete_config_path', 'env_flag',
           'fix_mmpretrain_multimodal', 'install', 'missing_names',
           'mmpretrain_would_fail', 'package_dir',
           'patch_dependency_module', 'register_config_scope', 'state',
           'transformers_major', 'wrap_get_cfg_path', 'wrap_installed_path']

#: the scope and package name
SCOPE = 'pola_mm'
#: the folder of ``configs/`` whose files are snippets, not complete configs
SNIPPETS = '_base_/'
#: the environment variable that turns the hook off
SWITCH = 'POLA_MM_STARTUP_HOOK'
#: the values of a boolean setting, compared in lower case
FALSE_VALUES = ('0', 'false', 'off', 'no')
TRUE_VALUES = ('1', 'true', 'on', 'yes')


def env_flag(name: str, default: bool) -> bool:
    """The boolean setting ``name`` of the environment: ``default`` where it
    is unset or empty, False for ``0``, ``false``, ``off``, ``no`` and True
    for ``1``, ``true``, ``on``, ``yes`` (any case, spaces ignored).

    Raises:
        ValueError: any other value, named with the ones accepted.
    """
    raw = os.environ.get(name, '')
    value = raw.strip().lower()
    if not value:
        return default
    if value in FALSE_VALUES:
        return False
    if value in TRUE_VALUES:
        return True
    raise ValueError(f'{name}={raw!r}: use one of '
                     f'{", ".join(FALSE_VALUES + TRUE_VALUES)}')


def package_dir() -> str:
    """The folder of the ``pola_mm`` package that ``import pola_mm`` would
    load (already imported: that one), found without importing it."""
    module = sys.modules.get(SCOPE)
    if module is not None and getattr(module, '__file__', None):
        return os.path.dirname(os.path.abspath(module.__file__))
    import importlib.util
    spec = importlib.util.find_spec(SCOPE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f'{SCOPE} is not importable')
    return os.path.abspath(list(spec.submodule_search_locations)[0])


def wrap_installed_path(
        get_installed_path: Callable[[str], str]) -> Callable[[str], str]:
    """``get_installed_path`` that answers :func:`package_dir` for
    ``'pola_mm'`` (``'pola-mm'`` too) and asks the original for any other
    package. Wrapping twice returns the first wrapper."""
    if getattr(get_installed_path, '_pola_mm_scope', False):
        return get_installed_path

    def installed_path(package: str) -> str:
        if package in (SCOPE, 'pola-mm'):
            return package_dir()
        return get_installed_path(package)

    installed_path._pola_mm_scope = True
    installed_path.__doc__ = get_installed_path.__doc__
    installed_path.__wrapped__ = get_installed_path
    return installed_path


def complete_config_path(cfg_path: str) -> str | None:
    """The file that ``pola_mm::<path>`` names where ``<path>`` is a
    complete config of ``configs/`` (every file outside ``_base_/``: the
    top-level configs such as ``mask_rcnn_pola_swin_t.py``, ``demo/...``);
    None for anything else (other scopes, the ``_base_/`` snippets, a path
    without a scope, ``..`` or an empty part), which mmengine reads itself.

    The file is ``<package dir>/.mim/configs/<path>``, where mmengine finds
    ``pola_mm::_base_/...``; whether it exists is not checked here.
    """
    scope, sep, rel = cfg_path.partition('::')
    if scope != SCOPE or not sep or '::' in rel or rel.startswith(SNIPPETS):
        return None
    parts = rel.split('/')
    if '\\' in rel or any(p in ('', '.', '..') for p in parts):
        return None
    return os.path.join(package_dir(), '.mim', 'configs', *parts)


def wrap_get_cfg_path(
    get_cfg_path: Callable[[str, str], tuple[str, str | None]]
) -> Callable[[str, str], tuple[str, str | None]]:
    """mmengine's ``Config._get_cfg_path`` (how a ``_base_`` entry becomes
    a file and a scope) that reads ``pola_mm::`` entries; every other entry
    goes to the original, unchanged. Wrapping twice returns the first
    wrapper.

    A ``pola_mm::`` entry first registers the scope
    (:func:`register_config_scope`), so that mmengine reads
    ``pola_mm::_base_/...`` as it reads ``mmdet::...``. A complete config
    (:func:`complete_config_path`) is read here: mmengine 0.10.7 reads
    ``<scope>::<path>`` only where ``<path>`` has a folder
    (``_get_package_and_cfg_path`` matches ``\\w*::\\w*/\\w*``), so
    ``pola_mm::mask_rcnn_pola_swin_t.py`` raised ``ValueError``; and it
    stamps the scope as ``_scope_`` on every unscoped typed dict of the
    base, but a complete config's pipelines, schedulers and loops are
    mmdet's, mmseg's, mmpretrain's or mmengine's (pola_mm's scope has a
    model registry only: under ``_scope_='pola_mm'`` mmengine would build
    mmcv's ``LoadAnnotations`` for mmdet's). So a complete config is
    returned with no scope, read as if it were a local file: its types
    resolve as when the config itself is run.

    Raises:
        FileNotFoundError: ``pola_mm::<config>`` names no file, as
            mmengine's ``check_file_exist`` says it.
    """
    if getattr(get_cfg_path, '_pola_mm_scope', False):
        return get_cfg_path

    def cfg_path_and_scope(cfg_path: str,
                           filename: str) -> tuple[str, str | None]:
        if not (isinstance(cfg_path, str)
                and cfg_path.startswith(SCOPE + '::')):
            return get_cfg_path(cfg_path, filename)
        register_config_scope()
        path = complete_config_path(cfg_path)
        if path is None:
            return get_cfg_path(cfg_path, filename)
        if not os.path.isfile(path):
            raise FileNotFoundError(f'file "{path}" does not exist')
        return path, None

    cfg_path_and_scope._pola_mm_scope = True
    cfg_path_and_scope.__doc__ = get_cfg_path.__doc__
    cfg_path_and_scope.__wrapped__ = get_cfg_path
    return cfg_path_and_scope


def _config_module() -> ModuleType:
    module = sys.modules.get('mmengine.config.config')
    if module is None:
        from mmengine.config import config as module
    return module


def read_pola_mm_entries(config_module: ModuleType | None = None) -> None:
    """What the start-up hook does to mmengine's config reader:
    ``Config._get_cfg_path`` reads ``pola_mm::`` entries
    (:func:`wrap_get_cfg_path`), and nothing else changes until it meets
    one. Idempotent.

    Args:
        config_module: ``mmengine.config.config`` (imported if not given).
    """
    config = (config_module or _config_module()).Config
    config._get_cfg_path = staticmethod(
        wrap_get_cfg_path(config._get_cfg_path))


def register_config_scope(config_module: ModuleType | None = None) -> None:
    """Let mmengine configs use ``pola_mm::`` bases now. Idempotent.

    Touches only mmengine's config reader, and only for the ``pola_mm``
    scope: ``MODULE2PACKAGE`` gains ``'pola_mm'``,
    ``mmengine.config.config.get_installed_path`` answers the package
    folder for ``'pola_mm'`` (correct for regular, editable and
    ``PYTHONPATH`` use alike: mmengine's own guess after ``pip install
    -e`` is ``<site-packages>/pola_mm``, which does not exist) and
    ``Config._get_cfg_path`` reads ``pola_mm::<complete config>``
    (:func:`read_pola_mm_entries`); every other package and scope is read
    as before. ``import pola_mm`` calls it; the start-up hook calls it at
    the first ``pola_mm::`` entry.

    Args:
        config_module: ``mmengine.config.config`` (imported if not given).
    """
    config_module = config_module or _config_module()
    utils = sys.modules.get('mmengine.config.utils')
    if utils is None:
        from mmengine.config import utils
    utils.MODULE2PACKAGE.setdefault(SCOPE, SCOPE)
    config_module.get_installed_path = wrap_installed_path(
        config_module.get_installed_path)
    read_pola_mm_entries(config_module)


def _patch_mim_utils(module: ModuleType) -> None:
    """openmim's ``get_installed_path`` (``mim.utils`` and
    ``mim.utils.utils``) answers pola_mm's folder for ``'pola_mm'``, where
    its own answer is another folder or an error (an editable install:
    mim guesses ``<site-packages>/pola_mm``); elsewhere mim is left as it
    is."""
    try:
        if os.path.samefile(module.get_installed_path(SCOPE), package_dir()):
            return
    except Exception:  # mim cannot answer (or a missing folder): complete
        pass
    for mod in (module, sys.modules.get('mim.utils.utils')):
        if mod is not None and hasattr(mod, 'get_installed_path'):
            mod.get_installed_path = wrap_installed_path(
                mod.get_installed_path)


# -- mmpretrain 1.2.0's multimodal models against transformers 5 --------------
# (pola_mm.compat_mmpretrain documents the failure; the code lives here so
# that the start-up hook applies it before anything imports pola_mm)

#: What mmpretrain 1.2.0 imports from transformers where
#: ``WITH_MULTIMODAL`` holds, by module (its multimodal models, their
#: tokenizers and its Hugging Face model registry).
MULTIMODAL_IMPORTS: dict[str, tuple[str, ...]] = {
    'transformers': (
        'PreTrainedModel', 'AutoConfig', 'AutoTokenizer', 'BartTokenizer',
        'BasicTokenizer', 'BertTokenizer', 'BertTokenizerFast',
        'LlamaTokenizer', 'WordpieceTokenizer', 'AutoModelForCausalLM'),
    'transformers.models.auto.auto_factory': ('_BaseAutoModelClass', ),
    'transformers.activations': ('ACT2FN', ),
    'transformers.modeling_outputs': (
        'BaseModelOutputWithPastAndCrossAttentions',
        'BaseModelOutputWithPoolingAndCrossAttentions',
        'CausalLMOutputWithCrossAttentions', 'BaseModelOutputWithPast',
        'CausalLMOutputWithPast', 'ModelOutput', 'Seq2SeqLMOutput'),
    'transformers.modeling_utils': (
        'PreTrainedModel', 'apply_chunking_to_forward',
        'find_pruneable_heads_and_indices', 'prune_linear_layer',
        'GenerationConfig', 'GenerationMixin', 'PretrainedConfig'),
    'transformers.models.bert.configuration_bert': ('BertConfig', ),
    'transformers.models.opt.configuration_opt': ('OPTConfig', ),
    'transformers.utils': (
        'add_code_sample_docstrings', 'add_start_docstrings',
        'add_start_docstrings_to_model_forward', 'logging',
        'replace_return_docstrings'),
}

#: ``'patched'`` where the fix set ``WITH_MULTIMODAL = False``, with the
#: missing names; empty until ``mmpretrain.utils.dependency`` loads.
state: dict[str, list[str]] = {}


def missing_names() -> list[str]:
    """``module.name`` for every name of :data:`MULTIMODAL_IMPORTS` that the
    installed transformers does not provide (a module that fails to import
    counts as all of its names). Imports transformers' modules, as
    mmpretrain's multimodal models would."""
    import importlib
    missing = []
    for module_name, names in MULTIMODAL_IMPORTS.items():
        try:
            module = importlib.import_module(module_name)
        except Exception:  # mmpretrain's bare except swallows these too
            module = None
        missing += [f'{module_name}.{n}' for n in names
                    if module is None or not hasattr(module, n)]
    return missing


def transformers_major() -> int:
    """The installed transformers' major version from its metadata (no
    import); 0 where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return int(version('transformers').split('.')[0])
    except (PackageNotFoundError, ValueError):
        return 0


def mmpretrain_would_fail() -> bool:
    """The gate of the fix, without importing either package: mmpretrain
    is installed and its multimodal models are not imported yet, and the
    installed transformers is a 5.x or newer (the release that removed
    the names); or the fix has been applied already. Where it holds, the
    names themselves are checked when mmpretrain's dependency module loads
    (:func:`patch_dependency_module`)."""
    if 'patched' in state:
        return True
    if 'mmpretrain.models.multimodal' in sys.modules:
        return False
    import importlib.util
    for name in ('mmpretrain', 'transformers'):
        try:
            if importlib.util.find_spec(name) is None:
                return False
        except (ImportError, ValueError):
            return False
    return transformers_major() >= 5


def _placeholder_register(missing: list[str],
                          version: str) -> Callable[[list, object], None]:
    """mmpretrain's ``register_multimodal_placeholder`` with a message that
    says why the model is unavailable and how to get it."""

    def register(names: list, registry: object) -> None:
        for name in names:

            def unavailable(*args, _name: str = name, **kwargs):
                raise ImportError(
                    f'{_name} is unavailable: mmpretrain 1.2.0\'s multimodal '
                    f'models import names that transformers {version} no '
                    f'longer has ({", ".join(missing)}), so pola_mm kept '
                    'them out of mmpretrain.models (which would otherwise '
                    'fail to import, and mmdet.models and mmseg.models '
                    'with it). To use them, install transformers<5: '
                    'pip install "transformers<5"')

            registry.register_module(name=name, module=unavailable,
                                     force=True)

    return register


def patch_dependency_module(dependency: ModuleType) -> bool:
    """Run on ``mmpretrain.utils.dependency`` right after it loads: where
    ``WITH_MULTIMODAL`` is True and transformers lacks a name of
    :data:`MULTIMODAL_IMPORTS`, set it False and make the placeholders say
    why. Returns whether it patched."""
    if not getattr(dependency, 'WITH_MULTIMODAL', False):
        return False
    missing = missing_names()
    if not missing:
        return False
    try:
        from importlib.metadata import version
        tf_version = version('transformers')
    except Exception:
        tf_version = '(unknown version)'
    dependency.WITH_MULTIMODAL = False
    dependency.register_multimodal_placeholder = _placeholder_register(
        missing, tf_version)
    state['patched'] = missing
    return True


def fix_mmpretrain_multimodal(dependency: ModuleType) -> bool:
    """The fix ``'mmpretrain_multimodal'``, run on
    ``mmpretrain.utils.dependency`` right after it loads (by the start-up
    hook, or by ``import pola_mm`` where no hook is installed): where
    :func:`mmpretrain_would_fail` (transformers >= 5 installed), then
    :func:`patch_dependency_module`. Nothing happens on any other stack.
    Returns whether it patched."""
    return mmpretrain_would_fail() and patch_dependency_module(dependency)


#: module name -> what completes it, run right after the module's body
PATCHES: dict[str, Callable[[ModuleType], object]] = {
    'mmengine.config.config': read_pola_mm_entries,
    'mim.utils': _patch_mim_utils,
    # before any reader of WITH_MULTIMODAL (mmpretrain.models, .datasets)
    # copies it: the first import of mmpretrain loads this module
    'mmpretrain.utils.dependency': fix_mmpretrain_multimodal,
}


#: the start-up hook's config entries of :data:`PATCHES`
_CONFIG_PATCHES = ('mmengine.config.config', 'mim.utils')


def _run_patch(name: str, module: ModuleType) -> None:
    try:
        PATCHES[name](module)
    except Exception as exc:  # never break the user's import
        import warnings
        hint = ('; import pola_mm before reading configs with pola_mm:: '
                'bases') if name in _CONFIG_PATCHES else ''
        warnings.warn(f'pola_mm_startup: could not complete {name} '
                      f'({type(exc).__name__}: {exc}){hint}')


class PostImportFinder:
    """A ``sys.meta_path`` entry that runs :data:`PATCHES` after their
    modules load; every other import gets ``None`` at once."""

    @classmethod
    def find_spec(cls, fullname: str, path=None, target=None):
        if fullname not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is cls or not hasattr(finder, 'find_spec'):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, 'exec_module', None)
        if exec_module is None:
            return spec

        def exec_then_patch(module: ModuleType) -> None:
            exec_module(module)
            if module.__name__ == fullname:  # a loader may be shared
                _run_patch(fullname, module)

        # on the loader object, not its class: other modules are untouched
        loader.exec_module = exec_then_patch
        return spec


def after_import(name: str, patch: Callable[[ModuleType], object]) -> str:
    """Run ``patch(module)`` right after module ``name`` is first imported,
    through :class:`PostImportFinder` (or now, if it already is).

    Adds ``name`` to :data:`PATCHES` (a name it holds already keeps its
    patch) and puts the finder first on ``sys.meta_path`` if it is not on
    it yet (the start-up hook has put it there in every installed pola_mm,
    unless ``POLA_MM_STARTUP_HOOK=0``).

    Returns:
        ``'applied'`` (the module was imported: patched now) or
        ``'deferred'``.
    """
    PATCHES.setdefault(name, patch)
    module = sys.modules.get(name)
    if module is not None:
        _run_patch(name, module)
        return 'applied'
    if PostImportFinder not in sys.meta_path:
        sys.meta_path.insert(0, PostImportFinder)
    return 'deferred'


def install() -> None:
    """Put :class:`PostImportFinder` first on ``sys.meta_path`` (once) and
    complete the modules of :data:`PATCHES` that are already imported.
    Nothing happens where :data:`SWITCH` is ``0``, ``false``, ``off`` or
    ``no``; another value it does not know is warned about, and the hook
    stays on."""
    try:
        if not env_flag(SWITCH, True):
            return
    except ValueError as exc:
        import warnings
        warnings.warn(f'pola_mm_startup: {exc}; the hook stays on')
    if PostImportFinder not in sys.meta_path:
        sys.meta_path.insert(0, PostImportFinder)
    for name in PATCHES:
        if name in sys.modules:
            _run_patch(name, sys.modules[name])
