"""Config mistakes as the tools' one-line errors.

A misspelled ``type`` or an option pola_mm removed would otherwise end a
run in a traceback, after the Runner has logged the whole config (hundreds
of lines). Two places turn them into one line naming the fix:

- :func:`first_config_mistake`, before a Runner is built: the ``model`` of
  a config, walked for ``type`` names that no registry of the config's
  scope holds and for removed options of pola_mm's backbones;
- :func:`config_error_line`, at the tools' boundary
  (:func:`pola_mm.cli.train_test.run_tool`): mmengine's ``KeyError`` for a
  name that is not in a registry (its message ``X is not in the
  scope::name registry``), and :class:`~pola_mm.models.RemovedOptionError`,
  whatever built them; any other exception is left alone.

Both name the closest registered names (:func:`close_names`). Nothing of
mmengine is patched: the registries are only read.
"""
import difflib
import importlib
import re
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from mmengine.registry import MODELS, DefaultScope, Registry

from ..models.backbones.base import RemovedOptionError, check_removed_options
from ..registry import MODELS as POLA_MODELS

__all__ = ['first_config_mistake', 'config_error_line', 'registry_error_line',
           'scope_registries', 'close_names', 'unknown_type_line']

#: Keys of a model config whose dict OpenMMLab builds from a registry
#: (models, task utils, initialisers, norm and activation layers); with
#: the patterns of :func:`_is_component`, the places where an unknown
#: ``type`` is a mistake. Elsewhere a model may read ``type`` itself
#: (mmdet's ``roi_layer`` from ``mmcv.ops``, ``nms`` by function name,
#: FPG's ``same_up_trans``, cascade RPN's ``adapt_cfg``): not checked.
COMPONENT_KEYS = frozenset({
    'data_preprocessor', 'init_cfg', 'norm_cfg', 'act_cfg', 'assigner',
    'sampler', 'bbox_coder', 'anchor_generator', 'prior_generator'})


#: mmengine's message for a name missing from a registry
#: (``mmengine/registry/build_functions.py``); the scope is left out by
#: its runner and scheduler builders.
_NOT_IN_REGISTRY = re.compile(
    r'(?P<type>\S+) is not in the (?:(?P<scope>[\w.]+)::)?'
    r'(?P<registry>[\w ]+?) registry\. ')


def _child_of_scope(registry: Registry, scope: str) -> Optional[Registry]:
    """``registry`` or the descendant of it whose scope is ``scope``."""
    if registry.scope == scope:
        return registry
    for child in registry.children.values():
        found = _child_of_scope(child, scope)
        if found is not None:
            return found
    return None


def scope_registries(scope: str) -> List[Registry]:
    """Every registry a config of default scope ``scope`` can name.

    mmengine's root registries, each as its child of ``scope`` where it has
    one (that child searches its parents too), and the registries of the
    scope's package (``<scope>.registry``), those without a parent included
    (mmpretrain's batch augments and tokenizers).
    """
    import mmengine.registry as roots
    found: Dict[int, Registry] = {}
    for value in vars(roots).values():
        if isinstance(value, Registry):
            registry = _child_of_scope(value, scope) or value
            found[id(registry)] = registry
    try:
        package = importlib.import_module(f'{scope}.registry')
    except ImportError:
        package = None
    for value in vars(package).values() if package else ():
        if isinstance(value, Registry):
            found.setdefault(id(value), value)
    return list(found.values())


def _lookup(registry: Registry, name: str) -> Any:
    """``registry.get(name)``; ``None`` where mmengine cannot resolve it
    (a dotted name it fails to import raises ``RuntimeError``)."""
    try:
        return registry.get(name)
    except RuntimeError:
        return None


def _registered_names(registries: Iterable[Registry]) -> List[str]:
    """The names of ``registries`` and of their parents (what
    ``Registry.get`` searches), sorted."""
    names = set()
    for registry in registries:
        while registry is not None:
            names.update(registry.module_dict)
            registry = registry.parent
    return sorted(names)


def close_names(name: str, registries: Iterable[Registry],
                n: int = 3) -> List[str]:
    """The registered names closest to ``name`` among ``registries`` and
    their parents: at most ``n``, closest first, none farther than
    ``difflib``'s 0.6 or much farther than the closest (0.2 of similarity);
    case is ignored and a ``scope.`` prefix dropped. Empty where none is
    close."""
    _, key = Registry.split_scope_key(name)
    key = key.lower()
    by_lower = {known.lower(): known for known in
                _registered_names(registries)}
    matches = difflib.get_close_matches(key, list(by_lower), n=n, cutoff=0.6)
    ratios = [difflib.SequenceMatcher(None, key, m).ratio() for m in matches]
    return [by_lower[match] for match, ratio in zip(matches, ratios)
            if ratio >= ratios[0] - 0.2]


def _suggestions(name: str, registry: Registry, scope: str) -> List[str]:
    """Close names from ``registry`` (with pola_mm's models beside a model
    registry), else from every registry of ``scope``."""
    first = [registry]
    if registry.name == POLA_MODELS.name:
        first.append(POLA_MODELS)
    return close_names(name, first) or close_names(
        name, scope_registries(scope))


def unknown_type_line(name: str, registry: Registry, suggestions: List[str],
                      where: str = '', elsewhere: bool = False) -> str:
    """The one line of an unknown ``type``.

    Args:
        name: the type as the config wrote it.
        registry: the registry it was looked up in (named with its scope).
        suggestions: the closest registered names (:func:`close_names`).
        where: the config path of its dict (``model.backbone``), if known.
        elsewhere: the other registries of the scope were searched too.
    """
    hint = (f'did you mean {", ".join(map(repr, suggestions))}?'
            if suggestions else 'no registered name is close: check the '
            'spelling and the custom_imports of the config')
    place = f'{where}: ' if where else ''
    searched = (f'nor in any other registry of scope {registry.scope!r}'
                if elsewhere else 'or its parents')
    return (f'{place}unknown type {name!r}: not in the '
            f'{registry.scope}::{registry.name} registry {searched}; {hint}')


def _is_component(key: str) -> bool:
    """Whether the dict under ``key`` is built from a registry
    (:data:`COMPONENT_KEYS`, ``*backbone``, ``*neck``, ``*head``,
    ``*roi_extractor``, ``loss*``)."""
    return (key in COMPONENT_KEYS or key.startswith('loss')
            or key.endswith(('backbone', 'neck', 'head', 'roi_extractor')))


def _typed_dicts(node: Any, path: str, scope: str,
                 component: bool) -> Iterator[Tuple[str, dict, str, bool]]:
    """``(path, dict, scope, component)`` of every dict with a ``type`` in
    ``node``, outer dicts first.

    ``component``: the dict sits where a registry builds it (the model, or
    under a key of :func:`_is_component`; list items take their list's
    key). A ``_scope_`` key sets the scope of its dict and of what the dict
    holds (as mmengine builds it).
    """
    if isinstance(node, dict):
        scope = node.get('_scope_') or scope
        if 'type' in node:
            yield path, node, scope, component
        for key, value in node.items():
            yield from _typed_dicts(value, f'{path}.{key}', scope,
                                    isinstance(key, str)
                                    and _is_component(key))
    elif isinstance(node, (list, tuple)):
        for index, value in enumerate(node):
            yield from _typed_dicts(value, f'{path}[{index}]', scope,
                                    component)


def _dict_mistake(path: str, node: dict, scope: str,
                  component: bool) -> Optional[str]:
    """The one line for ``node`` (a config dict at ``path``): its ``type``
    in no registry of ``scope`` (where ``component``), or a removed option
    of its class."""
    kind = node['type']
    if isinstance(kind, str):
        with MODELS.switch_scope_and_registry(scope) as registry:
            found = _lookup(registry, kind)
            others = scope_registries(scope) if found is None else []
            for other in others:
                found = _lookup(other, kind)
                if found is not None:
                    break
            if found is None and component:
                return unknown_type_line(
                    kind, registry, close_names(kind, [POLA_MODELS, *others]),
                    where=path, elsewhere=True)
    else:
        found = kind
    if isinstance(found, type):
        try:
            check_removed_options(found, node)
        except RemovedOptionError as exc:
            return f'{path}: {exc}'
    return None


def first_config_mistake(cfg: Any) -> Optional[str]:
    """The first config mistake in ``cfg.model``, as one line, or ``None``.

    Every dict with a ``type`` (outer first) is looked up as mmengine
    builds it, in the config's ``default_scope`` (``'mmengine'`` without
    one): in the model registry, else in any other registry of the scope
    (assigners, initialisers, ...). Where a registry builds the dict (the
    model, its backbone, necks, heads, losses, ...: :func:`_is_component`)
    a name in none of them is a mistake, reported with the closest
    registered names; so is an option of
    :data:`~pola_mm.models.backbones.base.REMOVED_OPTIONS` given to a
    backbone that removed it. Builds nothing (cheap enough to run before
    every Runner).

    Args:
        cfg: an mmengine ``Config`` (custom imports already imported, as
            ``Config.fromfile`` does).

    Returns:
        ``'<path>: unknown type ...'`` or ``'<path>: <Backbone>: the option
        ... was removed ...'``; ``None`` where nothing is wrong.
    """
    model = cfg.get('model')
    if model is None:
        return None
    scope = cfg.get('default_scope') or 'mmengine'
    for path, node, node_scope, component in _typed_dicts(model, 'model',
                                                          scope, True):
        mistake = _dict_mistake(path, node, node_scope, component)
        if mistake is not None:
            return mistake
    return None


def _current_scope() -> str:
    """The scope mmengine builds in now (``'mmengine'`` without one)."""
    current = DefaultScope.get_current_instance()
    return current.scope_name if current is not None else 'mmengine'


def registry_error_line(exc: KeyError) -> Optional[str]:
    """mmengine's ``KeyError`` for a name missing from a registry as one
    line with the closest registered names; ``None`` for any other
    ``KeyError``."""
    message = exc.args[0] if exc.args else None
    match = (_NOT_IN_REGISTRY.match(message)
             if isinstance(message, str) else None)
    if match is None:
        return None
    name, scope = match['type'], match['scope'] or _current_scope()
    registry = next((r for r in scope_registries(scope)
                     if r.name == match['registry']), None)
    if registry is None:
        return (f'unknown type {name!r}: not in the {scope}::'
                f'{match["registry"]} registry')
    return unknown_type_line(name, registry,
                             _suggestions(name, registry, scope))


def config_error_line(exc: BaseException) -> Optional[str]:
    """The one line of a config mistake found while building (an unknown
    ``type``: mmengine's ``KeyError``; a removed option:
    :class:`~pola_mm.models.RemovedOptionError`); ``None`` for anything
    else, which the caller re-raises."""
    if isinstance(exc, RemovedOptionError):
        return str(exc)
    if isinstance(exc, KeyError):
        return registry_error_line(exc)
    return None
