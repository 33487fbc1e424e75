"""The sequence-length mode of the benchmark (the attention alone): every
method runs both modes, caps stop a method, slopes are fitted; no timing is
asserted."""
import os
import sys

import pytest
from helpers import REPO, load_tool

from pola_mm.analysis.benchmark import (SeqLenResult, fit_slopes,
                                        format_seqlen_table, measure_seqlen,
                                        naive_bytes, plot_seqlen, run_seqlen,
                                        seq_grid)

pytestmark = pytest.mark.slow


def test_seq_grid_and_naive_bytes():
    assert seq_grid(4096) == (64, 64)
    assert seq_grid(200000) == (400, 500)
    assert seq_grid(13) == (1, 13)
    # logits + weights of (1, 2, N, N) float32, doubled with gradients
    assert naive_bytes(1000, 1, 2, 'fwd') == 2 * 4 * 2 * 10**6
    assert naive_bytes(1000, 1, 2, 'fwd+bwd') == 4 * 4 * 2 * 10**6


@pytest.mark.parametrize('method', ['polarity', 'sdpa', 'naive'])
@pytest.mark.parametrize('mode', ['fwd', 'fwd+bwd'])
def test_measure_each_method(method, mode):
    out = measure_seqlen(method, mode, 96, heads=2, head_dims=8, repeats=2)
    assert len(out['times']) == 2 and all(t > 0 for t in out['times'])
    assert out['peak_mem_mb'] >= out['base_mem_mb'] > 0


def test_measure_refuses_unknown_method():
    with pytest.raises(ValueError, match='method must be one of'):
        measure_seqlen('flash', 'fwd', 16)
    with pytest.raises(ValueError, match='unknown methods'):
        run_seqlen([16], methods=['flash'])


def test_run_seqlen_caps_naive_softmax_memory():
    """One worker process runs; the longer sequence is refused by the cap on
    the N x N matrices (0.03 MiB at 64 tokens, 0.125 MiB at 128)."""
    lines = []
    rs = run_seqlen([128, 64], methods=['naive'], modes=['fwd'],
                    mem_cap_mb=0.1, repeats=1, log=lines.append)
    assert [r.tokens for r in rs] == [64, 128]
    assert rs[0].error is None and rs[0].time_median > 0
    assert rs[1].skipped and 'GiB > cap' in rs[1].skipped
    assert rs[1].time_median is None and len(lines) == 2


def test_run_seqlen_stop_rule_stops_the_sweep():
    """The runner's stop rule: a length slower than the time cap stops the
    method; the longer lengths are skipped with the reason, not run."""
    lines = []
    rs = run_seqlen([64, 16, 32], methods=['sdpa'], modes=['fwd'],
                    time_cap_s=0.0, repeats=1, log=lines.append)
    assert [r.tokens for r in rs] == [16, 32, 64]
    assert rs[0].error is None and rs[0].time_median > 0
    for r in rs[1:]:
        assert r.skipped.startswith('stopped: 16 tokens took')
        assert r.time_median is None
    assert lines[0].startswith('[seqlen fwd] sdpa N=16: ')
    assert lines[2].startswith('[seqlen fwd] sdpa N=64: skipped (stopped')
    assert 'sdpa fwd: stopped: 16 tokens' in format_seqlen_table(rs)


def _fake(method, mode, n, t, mem):
    return SeqLenResult(method, mode, n, seq_grid(n), 1, 1, 32, 'cpu',
                        times=[t], time_median=t, peak_mem_mb=100 + mem,
                        base_mem_mb=100.0)


def test_fit_slopes_table_and_plot(tmp_path):
    ns = [1024, 4096, 16384, 65536]
    rs = [_fake('polarity', 'fwd', n, 1e-5 * n, 1e-3 * n) for n in ns]
    rs += [_fake('naive', 'fwd', n, 1e-9 * n * n, 4e-6 * n * n)
           for n in ns[:3]]
    rs.append(SeqLenResult('naive', 'fwd', 65536, seq_grid(65536), 1, 1, 32,
                           'cpu', skipped='N x N matrices need 32 GiB'))
    slopes = fit_slopes(rs)
    assert slopes[('polarity', 'fwd')]['time'] == pytest.approx(1.0)
    assert slopes[('polarity', 'fwd')]['mem'] == pytest.approx(1.0)
    assert slopes[('naive', 'fwd')]['time'] == pytest.approx(2.0)
    assert slopes[('naive', 'fwd')]['mem'] == pytest.approx(2.0)
    assert slopes[('naive', 'fwd')]['lengths'] == [1024, 4096, 16384]
    table = format_seqlen_table(rs)
    assert '| fwd | 65536 | 655.4 | 66 | skipped | - |' in table
    assert 'polarity fwd: time 1.00, memory added 1.00' in table
    assert 'naive fwd: N x N matrices need 32 GiB' in table
    png = tmp_path / 'seq.png'
    plot_seqlen(rs, str(png))
    assert png.stat().st_size > 0


def test_cli_parses_the_seqlen_mode(monkeypatch):
    """tools/analysis/benchmark.py: --seqlen selects the mode (parsed in this
    process; running it is run_seqlen, tested above)."""
    path = os.path.join(REPO, 'tools', 'analysis', 'benchmark.py')
    tool = load_tool('analysis', 'benchmark.py')
    monkeypatch.setattr(sys, 'argv', [
        path, '--seqlen', '4096', '16384', '--methods', 'polarity', 'sdpa',
        '--time-cap', '5', '--heads', '2'])
    args = tool.parse_args()
    assert args.seqlen == [4096, 16384]
    assert args.methods == ['polarity', 'sdpa']
    assert args.seq_modes == ['fwd', 'fwd+bwd']
    assert (args.time_cap, args.heads, args.head_dims) == (5.0, 2, 32)
    monkeypatch.setattr(sys, 'argv', [path, '--seqlen', '64', '--methods',
                                      'flash'])
    with pytest.raises(SystemExit):
        tool.parse_args()
