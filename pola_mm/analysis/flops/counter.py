"""The FLOP counter: one forward pass seen by a dispatch mode.

:func:`count_flops` runs a forward once under :class:`_Counter`, a
:class:`~torch.utils._python_dispatch.TorchDispatchMode` (as
:class:`torch.utils.flop_counter.FlopCounterMode`): every aten operation
is charged its cost (:mod:`.aten`) to the innermost module whose
``__call__`` is running (forward pre- and post-hooks on every submodule).

The calls of the functions of :data:`~.formulas.FORMULAS` are charged
their formula instead, and the aten operations inside them are not
counted. Nothing is replaced while counting (no module global, method or
function): the counter observes the calls.

- An op that reports its calls (:func:`pola_mm.ops.reports_calls`: the
  attention ops, their references, the table resize) tells the counter,
  registered for the count with :func:`pola_mm.ops.observe_calls`, that it
  runs: charged from the arguments it was called with when it returns,
  whatever name the model calls it by.
- Any other registered Python function (one's own, not decorated) is found
  on the Python call stack when an aten operation runs inside it: charged
  once per call, from its parameters as they are at that first operation.

A call inside another call charged by formula is part of that one.
"""
import contextlib
import inspect
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from ...ops import observe_calls, reporting, use_implementation
from .aten import SHAPE_ONLY, aten, aten_costs, zeros_of_shape
from .formulas import FORMULAS, OpFormula

__all__ = ['FlopReport', 'count_flops', 'count_params']


@dataclass
class FlopReport:
    """What one counted forward found.

    Attributes:
        total: FLOPs of the whole forward.
        by_module: FLOPs per module name (``''`` is the root), each
            including its submodules. An operation is charged to the
            innermost module whose ``__call__`` is running, so work done in a
            method called directly (mmdet's ``roi_head.forward``) outside
            any submodule goes to the nearest caller module.
        by_op: FLOPs per operation: aten op names, and the labels of the
            functions charged by formula (:data:`~.formulas.FORMULAS`:
            ``'polarity_attention'``, ``'pacs_attention'``).
        params: parameters per module name, each including its submodules.
        uncounted: aten ops seen but not charged (elementwise and
            data-movement ops, by convention) with how often they ran.
        rois: for a two-stage detector counted by
            :func:`~.complexity.model_complexity`, the RoIs per image its
            heads ran on: ``proposals`` (each box head stage) and
            ``detections`` (each mask head), see
            :func:`~.rois.published_rois`; empty otherwise.
    """
    total: int = 0
    by_module: Dict[str, int] = field(default_factory=dict)
    by_op: Dict[str, int] = field(default_factory=dict)
    params: Dict[str, int] = field(default_factory=dict)
    uncounted: Dict[str, int] = field(default_factory=dict)
    rois: Dict[str, int] = field(default_factory=dict)


class _Counter(TorchDispatchMode):
    """Charges each aten op to the modules on the current call stack, and
    the calls of :data:`~.formulas.FORMULAS` by their formulas."""

    def __init__(self, report: FlopReport, model: nn.Module,
                 compute: bool = True) -> None:
        super().__init__()
        self.shape_only = set() if compute else {
            getattr(aten, name) for name in SHAPE_ONLY
            if hasattr(aten, name)}
        self.report = report
        self.stack: List[str] = ['']  # the root, however it is called
        self.modules = dict(model.named_modules())
        self.own: Dict[str, int] = {}
        self.suppress = 0  # inside a reported call charged by formula
        self.handlers = aten_costs()
        # registered functions that do not report their calls, by code
        self.on_stack: Dict[Any, tuple] = {
            fn.__code__: (inspect.signature(fn), formula)
            for fn, formula in FORMULAS.items()
            if not reporting(fn) and hasattr(fn, '__code__')}
        self.stack_call: Optional[FrameType] = None  # the last one charged

    def add(self, op: str, flops: int) -> None:
        r = self.report
        r.total += flops
        r.by_op[op] = r.by_op.get(op, 0) + flops
        # the innermost module called through __call__; totals including
        # submodules are summed by name afterwards (methods such as
        # ``roi_head.forward`` called directly still count for their parent)
        name = self.stack[-1]
        self.own[name] = self.own.get(name, 0) + flops

    def caller(self) -> Optional[nn.Module]:
        """The innermost module running."""
        return self.modules.get(self.stack[-1])

    def charge(self, formula: OpFormula, arguments: Dict[str, Any]) -> None:
        label, flops = formula
        n = int(flops(arguments, self.caller()))
        if n:
            self.add(label, n)

    @contextlib.contextmanager
    def op_call(self, op: Callable[..., Any],
                arguments: Dict[str, Any]) -> Iterator[None]:
        """The observer of the reported calls
        (:func:`pola_mm.ops.observe_calls`): an op with a formula, unless
        inside another call charged by formula, is charged its formula
        once it returns, and its aten operations are not counted."""
        formula = FORMULAS.get(op)
        if formula is None or self.suppress or self.in_stack_call():
            yield
            return
        self.suppress += 1
        try:
            yield
        finally:
            self.suppress -= 1
        self.charge(formula, arguments)

    def in_stack_call(self) -> bool:
        """Whether a registered function that does not report its calls is
        running (the outermost one on the stack is charged, once per
        call)."""
        if not self.on_stack:
            return False
        frame: Optional[FrameType] = sys._getframe(1)
        outer = None
        while frame is not None:
            if frame.f_code in self.on_stack:
                outer = frame
            frame = frame.f_back
        if outer is None:
            return False
        if outer is not self.stack_call:  # a new call (the last one is
            self.stack_call = outer       # held, so no frame reuses it)
            signature, formula = self.on_stack[outer.f_code]
            local = outer.f_locals
            self.charge(formula, {name: local[name]
                                  for name in signature.parameters
                                  if name in local})
        return True

    def finish(self, names: Sequence[str]) -> None:
        """Fill ``report.by_module``: each module's FLOPs including those
        of its submodules."""
        by_module = dict.fromkeys(names, 0)
        for name, flops in self.own.items():
            parts = name.split('.') if name else []
            for i in range(len(parts) + 1):
                key = '.'.join(parts[:i])
                by_module[key] = by_module.get(key, 0) + flops
        self.report.by_module = by_module
        self.stack_call = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in self.shape_only:
            out = zeros_of_shape(func, args, kwargs or {})
        else:
            out = func(*args, **(kwargs or {}))
        if self.suppress or self.in_stack_call():
            return out
        handler = self.handlers.get(func.overloadpacket)
        if handler is None:
            name = func.overloadpacket.__name__
            self.report.uncounted[name] = self.report.uncounted.get(
                name, 0) + 1
        else:
            self.add(func.overloadpacket.__name__, int(handler(args, out)))
        return out


@contextlib.contextmanager
def _tracked(model: nn.Module, counter: _Counter) -> Iterator[None]:
    """Module-stack hooks on every submodule."""
    handles = []
    for name, module in model.named_modules():
        if not name:  # the root is always on the stack
            continue

        def pre(m, a, name=name):
            counter.stack.append(name)

        def post(m, a, o, name=name):
            if counter.stack and counter.stack[-1] == name:
                counter.stack.pop()

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def count_params(model: nn.Module) -> Dict[str, int]:
    """Parameters per module name (``''`` the root), each including its
    submodules; shared parameters are counted once."""
    out: Dict[str, int] = {}
    for name, module in model.named_modules():
        seen = {id(p): p.numel() for p in module.parameters()}
        out[name] = sum(seen.values())
    return out


def count_flops(model: nn.Module, forward: Callable[[], Any],
                fast_paths: bool = False, compute: bool = True
                ) -> FlopReport:
    """Count the FLOPs of ``forward()``, a call that runs ``model`` (or a
    part of it) once; see :mod:`pola_mm.analysis.flops` for the convention.

    Args:
        model: the module whose submodules are attributed (names as in
            ``model.named_modules()``).
        forward: runs the forward pass, e.g. ``lambda: model(x)``.
        fast_paths: leave pola_mm's fast paths as they are (default: off
            while counting, every op runs its reference). The ops of
            :data:`~.formulas.FORMULAS` are charged by formula either way:
            the public ops are registered, and their fast kernels run
            inside them.
        compute: False: do not compute the matrix products, convolutions
            and fused attention (their outputs are zeros of the right shape
            and strides, from their meta kernels), the bulk of a forward's
            work. The count is the same as long as no shape depends on the
            values, as in classifiers, segmentors and detectors counted by
            :func:`~.complexity.model_complexity` (whose RoI counts are
            fixed, :func:`~.rois.published_rois`); the outputs are
            meaningless.

    Returns:
        a :class:`FlopReport` (``params`` filled from ``model``).
    """
    report = FlopReport(params=count_params(model))
    counter = _Counter(report, model, compute=compute)
    paths = (contextlib.nullcontext() if fast_paths else
             use_implementation('graph'))
    with paths, _tracked(model, counter), \
            observe_calls(counter.op_call), counter:
        forward()
    counter.finish([name for name, _ in model.named_modules()])
    return report
