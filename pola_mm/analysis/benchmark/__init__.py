"""Speed and memory benchmarks, each measurement in its own process.

- :mod:`.worker`: what both share (the worker process and its launch,
  timed steps, peak memory);
- :mod:`.backbones`: backbones, Pola and softmax side by side
  (``tools/analysis/benchmark.py``);
- :mod:`.onnxrt`: the backbones exported, checked and timed in ONNX Runtime
  (``tools/analysis/benchmark.py --runtime onnxruntime``);
- :mod:`.whole`: whole detectors exported by MMDeploy, checked and timed
  in ONNX Runtime (``tools/analysis/benchmark.py --runtime onnxruntime
  --whole ...``);
- :mod:`.seqlen`: the attention alone against sequence length
  (``tools/analysis/benchmark.py --seqlen``).
"""
from .backbones import (BASELINES, MODEL_ZOO, PRESETS, BenchmarkCase,
                        BenchmarkResult, baseline_of, benchmark_model,
                        build_benchmark_model, build_with_plain_paths,
                        compute_growth, compute_ratios, format_ratio,
                        format_table, measure,
                        parse_size, plot_results, run_benchmarks, size_str)
from .onnxrt import RUNTIMES
from .seqlen import (SEQ_METHODS, SEQ_MODES, SeqLenResult, fit_slopes,
                     format_seqlen_table, measure_seqlen, naive_bytes,
                     plot_seqlen, run_seqlen, seq_grid)
from .whole import WHOLE_MODELS, run_whole_benchmarks, whole_spec
from .worker import Size

__all__ = [
    'BASELINES', 'MODEL_ZOO', 'PRESETS', 'BenchmarkCase', 'BenchmarkResult',
    'Size', 'baseline_of', 'benchmark_model', 'build_benchmark_model',
    'build_with_plain_paths', 'compute_growth', 'compute_ratios',
    'format_ratio', 'format_table', 'measure', 'parse_size', 'plot_results',
    'run_benchmarks', 'size_str', 'RUNTIMES', 'SEQ_METHODS', 'SEQ_MODES',
    'SeqLenResult', 'fit_slopes', 'format_seqlen_table', 'measure_seqlen',
    'naive_bytes', 'plot_seqlen', 'run_seqlen', 'seq_grid', 'WHOLE_MODELS',
    'run_whole_benchmarks', 'whole_spec'
]
