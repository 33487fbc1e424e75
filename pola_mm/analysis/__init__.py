"""What the tools under ``tools/analysis`` call.

- :mod:`.zoo`: the models by name (read from the backbones' ``arch_zoo``)
  and the one builder of the tools;
- :mod:`.benchmark`: speed and memory, Pola and softmax side by side;
- :mod:`.train_memory`: activation memory of a training step, without a
  GPU;
- :mod:`.flops`: parameters and FLOPs, the attention ops charged by their
  published formulas;
- :mod:`.attention`: the attention maps of a block (capture, statistics,
  plots).

Kept out of ``pola_mm/__init__`` on purpose: importing ``pola_mm`` does not
import this package, and this package never imports mmdet at import time.
"""
from .benchmark import (PRESETS, BenchmarkResult, benchmark_model,
                        format_table, plot_results, run_benchmarks)
from .zoo import build, counterpart, zoo, zoo_names

__all__ = [
    'PRESETS', 'BenchmarkResult', 'benchmark_model', 'run_benchmarks',
    'format_table', 'plot_results', 'zoo', 'zoo_names', 'build', 'counterpart'
]
