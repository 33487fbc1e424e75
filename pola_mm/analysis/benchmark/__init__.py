"""Speed and memory benchmarks, measured in worker processes.

From the bottom up (each module imports only those above it):

- :mod:`.worker`: the worker process and its launch, timed steps, peak
  memory;
- :mod:`.results`: what a result holds, input sizes, and the one runner of
  every mode (rounds in alternating order, pooled, logged, a stop rule);
- :mod:`.onnxrt`: models exported and checked once, their files timed
  alternately in one process in ONNX Runtime and/or OpenVINO
  (``tools/analysis/benchmark.py --runtime onnxruntime [openvino]``);
- :mod:`.ortprofile`: ONNX Runtime's own profile of an exported model
  (``--ort-profile``);
- :mod:`.whole`: whole detectors exported by MMDeploy, checked and timed
  as in :mod:`.onnxrt` (``--runtime onnxruntime --whole ...``);
- :mod:`.backbones`: backbones, Pola and softmax side by side, in PyTorch
  or exported (``tools/analysis/benchmark.py``);
- :mod:`.report`: ratios against the baselines, the table and the plot;
- :mod:`.seqlen`: the attention alone against sequence length
  (``tools/analysis/benchmark.py --seqlen``).

The models are those of :mod:`pola_mm.analysis.zoo`.
"""
from .backbones import (PRESETS, BenchmarkCase, benchmark_model, measure,
                        run_benchmarks)
from .onnxrt import RUNTIMES
from .report import (BASELINES, baseline_of, compute_growth, compute_ratios,
                     format_ratio, format_table, plot_results)
from .results import BenchmarkResult, parse_size, size_str
from .seqlen import (DEFAULT_SEQ_METHODS, SEQ_METHODS, SEQ_MODES, SeqLenResult,
                     fit_slopes, format_seqlen_table, measure_seqlen,
                     naive_bytes, plot_seqlen, run_seqlen, seq_grid)
from .whole import WHOLE_MODELS, run_whole_benchmarks, whole_spec
from .worker import Size

__all__ = [
    'BASELINES', 'PRESETS', 'BenchmarkCase', 'BenchmarkResult', 'Size',
    'baseline_of', 'benchmark_model', 'compute_growth', 'compute_ratios',
    'format_ratio', 'format_table', 'measure', 'parse_size', 'plot_results',
    'run_benchmarks', 'size_str', 'RUNTIMES', 'SEQ_METHODS',
    'DEFAULT_SEQ_METHODS', 'SEQ_MODES',
    'SeqLenResult', 'fit_slopes', 'format_seqlen_table', 'measure_seqlen',
    'naive_bytes', 'plot_seqlen', 'run_seqlen', 'seq_grid', 'WHOLE_MODELS',
    'run_whole_benchmarks', 'whole_spec'
]
