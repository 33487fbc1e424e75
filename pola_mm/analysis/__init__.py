"""Analysis utilities of pola_mm (speed and memory benchmarks).

Kept out of ``pola_mm/__init__`` on purpose: importing ``pola_mm`` does not
import this package, and this package never imports mmdet at import time.
"""
from .benchmark import (MODEL_ZOO, PRESETS, BenchmarkResult, benchmark_model,
                        format_table, plot_results, run_benchmarks)

__all__ = [
    'MODEL_ZOO', 'PRESETS', 'BenchmarkResult', 'benchmark_model',
    'run_benchmarks', 'format_table', 'plot_results'
]
