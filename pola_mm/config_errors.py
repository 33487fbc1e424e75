"""mmengine's build errors for a config mistake, as one line.

A misspelled ``type`` or a key that its class does not take ends a run in
an exception from deep inside mmengine's build, under the upstream tools
after the Runner has logged the whole config. :func:`build_error_line`
turns the two exceptions of such a build into one line with the closest
names, read from the exception itself (the frames of mmengine's
``build_from_cfg`` in its traceback):

- the ``KeyError`` that mmengine's builder raises for a name that is not
  in the registry: the name and the registry are the failing build's;
  the suggestions are the registry's names and its parents' (those it
  searched);
- the ``TypeError`` of a class given a key it does not take: the key is
  one of the built dict's that Python's message names; the suggestions
  are the parameters of the class.

Anything else gives ``None``, and the caller re-raises it. pola_mm's tools
print the line at their boundary (:func:`pola_mm.cli.train_test.run_tool`,
``tools/analysis/get_flops.py``). ``import pola_mm`` chains
:func:`excepthook` to ``sys.excepthook``, so that under the upstream tools
(mmdet's, mmseg's, mmpretrain's ``tools/train.py``, which import pola_mm
through a config's ``custom_imports``) the same two exceptions, where
nothing catches them, end in the same line instead of a traceback, and so
does a backbone's missing ImageNet checkpoint
(:class:`~pola_mm.models.checkpoint.PretrainedNotFoundError`, which says
where to get it); every other exception goes to the hook that was there
before.
"""
import difflib
import functools
import inspect
import sys
from types import FrameType, TracebackType
from typing import Any, Callable, List, Optional

from mmengine.registry import Registry, build_functions

__all__ = ['build_error_line', 'excepthook', 'install_excepthook']

#: mmengine's builders that look a type up in a registry (their ``KeyError``
#: for a missing name is raised in their own frame)
_BUILDERS = frozenset(f.__code__ for f in (
    build_functions.build_from_cfg, build_functions.build_runner_from_cfg,
    build_functions.build_scheduler_from_cfg))


def _builds(tb: Optional[TracebackType]) -> List[FrameType]:
    """The frames of mmengine's builders in a traceback, outermost first."""
    frames = []
    while tb is not None:
        if tb.tb_frame.f_code in _BUILDERS:
            frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _close(name: str, known: List[str]) -> str:
    """``'; did you mean ...?'`` with the names of ``known`` closest to
    ``name`` (case ignored; at most three, none much farther than the
    closest), or ``''``."""
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=3,
                                      cutoff=0.6)
    if not close:
        return ''
    ratios = [difflib.SequenceMatcher(None, name.lower(), c).ratio()
              for c in close]
    return '; did you mean ' + ', '.join(
        repr(by_lower[c]) for c, r in zip(close, ratios)
        if r >= ratios[0] - 0.2) + '?'


def _where(frames: List[FrameType], index: int) -> str:
    """`` (the <key> of <Class>)`` where the build ``frames[index]`` built
    a value of the build around it, or ``''``."""
    if index == 0:
        return ''
    cfg = frames[index].f_locals.get('cfg')
    outer = frames[index - 1].f_locals
    owner = outer.get('obj_cls')
    for key, value in (outer.get('args') or {}).items():
        items = value if isinstance(value, (list, tuple)) else [value]
        for i, item in enumerate(items):
            if item is cfg or (isinstance(item, dict) and item == cfg):
                part = f'{key}[{i}]' if items is value else key
                name = getattr(owner, '__name__', None)
                return f' (the {part} of {name})' if name else ''
    return ''


def _unknown_type(exc: KeyError, frames: List[FrameType]) -> Optional[str]:
    """mmengine's ``KeyError`` for a type that is not in the registry: its
    builder's frame is the last of the traceback."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if not frames or tb is None or tb.tb_frame is not frames[-1]:
        return None
    local = frames[-1].f_locals
    name = local.get('obj_type', local.get('scheduler_type'))
    registry = local.get('registry')
    if not isinstance(name, str) or not isinstance(registry, Registry):
        return None
    known = set()
    searched = registry
    while searched is not None:  # what Registry.get searches
        known.update(searched.module_dict)
        searched = searched.parent
    key = Registry.split_scope_key(name)[1]
    hint = _close(key, sorted(known)) or (
        '; no registered name is close: check the spelling and the '
        "config's custom_imports")
    return (f'unknown type {name!r}{_where(frames, len(frames) - 1)}: not '
            f'in the {registry.scope}::{registry.name} registry or its '
            f'parents{hint}')


def _parameters(obj: Callable) -> List[str]:
    """The keyword parameters ``obj`` takes; for a class whose
    ``__init__`` passes ``**kwargs`` on, those of every ``__init__`` of
    its bases too."""
    targets = [c.__init__ for c in obj.__mro__ if '__init__' in vars(c)] \
        if inspect.isclass(obj) else [obj]
    names: List[str] = []
    for target in targets:
        try:
            params = inspect.signature(target).parameters.values()
        except (TypeError, ValueError):  # no signature (a builtin)
            break
        names += [p.name for p in params if p.name != 'self' and p.kind in (
            p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return sorted(set(names))


def _unexpected_key(exc: TypeError,
                    frames: List[FrameType]) -> Optional[str]:
    """Python's ``TypeError`` for a keyword that the innermost build's
    class does not take, where the keyword is a key of the built dict."""
    if not frames:
        return None
    local = frames[-1].f_locals
    obj, args = local.get('obj_cls'), local.get('args')
    if obj is None or not isinstance(args, dict):
        return None
    message = str(exc)
    key = next((k for k in args if isinstance(k, str) and
                f'unexpected keyword argument {k!r}' in message), None)
    if key is None:
        return None
    known = _parameters(obj)
    if key in known:
        return None
    name = getattr(obj, '__name__', repr(obj))
    return (f'{name}{_where(frames, len(frames) - 1)} takes no argument '
            f'{key!r}{_close(key, known)}')


def build_error_line(exc: BaseException) -> Optional[str]:
    """The one line of a config mistake that mmengine met while building
    (an unknown ``type``: mmengine's ``KeyError``; a key the class does not
    take: Python's ``TypeError``), read from ``exc`` and its traceback;
    ``None`` for any other exception, which the caller re-raises."""
    frames = _builds(exc.__traceback__)
    if isinstance(exc, KeyError):
        return _unknown_type(exc, frames)
    if isinstance(exc, TypeError):
        return _unexpected_key(exc, frames)
    return None


def excepthook(exc_type: type, exc: BaseException, tb: TracebackType,
               previous: Callable[..., Any] = sys.__excepthook__) -> None:
    """``sys.excepthook`` after ``import pola_mm``: an exception that
    :func:`build_error_line` reads as a config mistake, and pola_mm's
    :class:`~pola_mm.models.checkpoint.PretrainedNotFoundError` (a
    backbone's ImageNet checkpoint missing, with where to get it), is one
    line on stderr (``error: ...``; Python then exits with 1); anything
    else goes to ``previous``."""
    from .models.checkpoint import PretrainedNotFoundError
    if isinstance(exc, PretrainedNotFoundError):
        line = str(exc)
    elif isinstance(exc, (KeyError, TypeError)):
        line = build_error_line(exc)
    else:
        line = None
    if line is None:
        previous(exc_type, exc, tb)
    else:
        print(f'error: {line}', file=sys.stderr, flush=True)


def install_excepthook() -> None:
    """Chain :func:`excepthook` to ``sys.excepthook``, once per process."""
    if getattr(sys.excepthook, 'func', None) is not excepthook:
        sys.excepthook = functools.partial(excepthook,
                                           previous=sys.excepthook)
