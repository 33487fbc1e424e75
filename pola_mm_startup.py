"""pola_mm's startup hook: ``pola_mm::`` config bases in every program.

Installing pola_mm (a wheel or ``pip install -e``) puts
``pola_mm_startup.pth`` into site-packages (``setup.py`` writes it). Python
runs its one line, ``import pola_mm_startup; pola_mm_startup.install()``, at
every start. :func:`install` imports nothing (this module uses ``sys`` and
``os`` only, both loaded by then) and puts :class:`PostImportFinder` first on
``sys.meta_path``. The finder finds no module itself: for every import it
answers ``None`` after one dictionary look-up, except for the modules of
:data:`PATCHES`, whose loading it lets the other finders do and then
completes:

* ``mmengine.config.config`` (mmengine's config reader): ``'pola_mm'``
  joins ``mmengine.config.utils.MODULE2PACKAGE`` and the module's
  ``get_installed_path`` answers pola_mm's package folder for
  ``'pola_mm'`` (:func:`register_config_scope`). mmdet's, mmseg's and
  mmpretrain's own ``tools/train.py`` / ``tools/test.py``, ``mim train`` and
  any script then read a config whose ``_base_`` names
  ``pola_mm::_base_/...``, with no edit and no ``import pola_mm``; the
  snippet's ``custom_imports`` imports pola_mm (the models) as the config
  is read.
* ``mim.utils`` (openmim): its ``get_installed_path`` answers the same
  folder for ``'pola_mm'``, so ``mim search pola_mm`` finds
  ``pola_mm/.mim/model-index.yml`` after an editable install, where mim's
  guess (``<site-packages>/pola_mm``) does not exist.

The finder is pola_mm's one post-import mechanism: ``import pola_mm``
adds its own completions through :func:`after_import` (the MMDeploy fixes
wait for ``mmdeploy.core`` there, :mod:`pola_mm.deployment.mmdeploy_fixes`),
which puts the finder on ``sys.meta_path`` only if it is not there yet.

Neither torch nor mmengine nor pola_mm is imported at start-up; a program
that never imports mmengine pays for reading this file and one dictionary
look-up per import. ``POLA_MM_STARTUP_HOOK=0`` in the environment turns the
hook off. Why a startup hook: docs/install.md.
"""
import os
import sys

__all__ = ['PATCHES', 'PostImportFinder', 'after_import', 'install',
           'package_dir', 'register_config_scope', 'wrap_installed_path']

#: the scope and package name
SCOPE = 'pola_mm'


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


def wrap_installed_path(get_installed_path):
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


def register_config_scope(config_module=None) -> None:
    """Let mmengine configs use ``pola_mm::`` bases. Idempotent.

    Touches only mmengine's config reader: ``MODULE2PACKAGE`` gains
    ``'pola_mm'`` and ``mmengine.config.config.get_installed_path`` answers
    the package folder for ``'pola_mm'`` (correct for regular, editable and
    ``PYTHONPATH`` use alike; every other package is looked up as before).

    Args:
        config_module: ``mmengine.config.config`` (imported if not given).
    """
    if config_module is None:
        from mmengine.config import config as config_module
    utils = sys.modules.get('mmengine.config.utils')
    if utils is None:
        from mmengine.config import utils
    utils.MODULE2PACKAGE.setdefault(SCOPE, SCOPE)
    config_module.get_installed_path = wrap_installed_path(
        config_module.get_installed_path)


def _patch_mim_utils(module) -> None:
    """openmim's ``mim.utils`` (and ``mim.utils.utils``): the package folder
    for ``'pola_mm'``."""
    for mod in (module, sys.modules.get('mim.utils.utils')):
        if mod is not None and hasattr(mod, 'get_installed_path'):
            mod.get_installed_path = wrap_installed_path(
                mod.get_installed_path)


#: module name -> what completes it, run right after the module's body
PATCHES = {
    'mmengine.config.config': register_config_scope,
    'mim.utils': _patch_mim_utils,
}


#: the start-up hook's own entries of :data:`PATCHES`
_CONFIG_PATCHES = tuple(PATCHES)


def _run_patch(name: str, module) -> None:
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
    def find_spec(cls, fullname, path=None, target=None):
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

        def exec_then_patch(module):
            exec_module(module)
            if module.__name__ == fullname:  # a loader may be shared
                _run_patch(fullname, module)

        # on the loader object, not its class: other modules are untouched
        loader.exec_module = exec_then_patch
        return spec


def after_import(name: str, patch) -> str:
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
    Nothing happens if ``POLA_MM_STARTUP_HOOK=0``."""
    if os.environ.get('POLA_MM_STARTUP_HOOK', '1') == '0':
        return
    if PostImportFinder not in sys.meta_path:
        sys.meta_path.insert(0, PostImportFinder)
    for name in PATCHES:
        if name in sys.modules:
            _run_patch(name, sys.modules[name])
