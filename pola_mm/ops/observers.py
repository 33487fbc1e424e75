"""The calls of the public ops, reported to whoever observes them.

An analysis tool sometimes needs to see an op being called: the FLOPs
counter charges :func:`~pola_mm.ops.polarity_attention` its published
formula instead of the operations it runs, the attention tools record the
tensors :func:`~pola_mm.ops.gate_linear` receives. The ops that may be
observed are decorated with :func:`reports_calls`; a tool registers an
observer for a block of code with :func:`observe_calls`. The models know
nothing of it, and nothing is replaced anywhere: every caller, whatever
name it calls the op by, calls the one decorated function.

An observer is a callable ``observer(op, arguments)`` returning a context
manager: ``op`` is the public function called, ``arguments`` its
arguments by name (defaults filled in); the op runs inside the context.
With no observer registered an op costs one extra check of an empty list
per call; that is all that ``torch.compile``, ``torch.export`` and the
ONNX exporters see of it (the tools observe eager runs only).

Example::

    @contextlib.contextmanager
    def show(op, arguments):
        print(op.__name__, arguments['q'].shape)
        yield

    with observe_calls(show):
        model(x)

Like :func:`~pola_mm.ops.use_implementation`, the registration is process-wide,
not per thread.
"""
import contextlib
import functools
import inspect
from typing import Any, Callable, ContextManager, Dict, Iterator, List

__all__ = ['OpObserver', 'reports_calls', 'reporting', 'observe_calls']

#: ``observer(op, arguments)``: a context manager the op runs inside.
OpObserver = Callable[[Callable[..., Any], Dict[str, Any]],
                      ContextManager[Any]]

#: The registered observers, outermost first.
_observers: List[OpObserver] = []


def reports_calls(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator of a public op: its calls are reported to the observers
    registered with :func:`observe_calls` (none: the op only checks that
    the list is empty). The decorated function has ``fn``'s name,
    signature and documentation (``functools.wraps``)."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        if not _observers:
            return fn(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        with contextlib.ExitStack() as stack:
            for observer in list(_observers):
                stack.enter_context(observer(op, arguments))
            return fn(*args, **kwargs)

    op.reports_calls = True
    return op


def reporting(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` reports its calls (is decorated with
    :func:`reports_calls`)."""
    return getattr(fn, 'reports_calls', False) is True


@contextlib.contextmanager
def observe_calls(observer: OpObserver) -> Iterator[None]:
    """While active, ``observer`` sees every call of an op decorated with
    :func:`reports_calls` (calls inside other reported calls included);
    observers registered inside it are nested inside it."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)
