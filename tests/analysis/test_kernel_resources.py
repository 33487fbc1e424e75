"""The kernel resource check (``tools/analysis/kernel_resources.py``,
:mod:`pola_mm.analysis.kernel_resources`): every Triton launch of the
attention ops compiled for sm_80 / sm_86 / sm_89 / sm_90 on this machine.

- The launches it compiles are the ones the JIT compiles: the capture's
  bound arguments (signature, constants, divisibility attributes, launch
  options) equal what ``JITFunction.run`` itself hands to the compiler for
  the same calls (its ``jit_cache_hook``, reached through a stand-in
  driver that reports an sm_90 GPU: nothing compiles or runs).
- The shipped models' launch configurations pass: no compile error, no
  local memory (spills), shared memory within each target's per-block
  limit, registers that let a block reside, on all four targets, for the
  shipped head widths (32: Pola-Swin, PolaPP; 64: Pola-PVT, PolaPP) in
  float32 and float16, every flag both ways (key bias, rotary encoding,
  scaled keys, atomic or per-chunk partial sums, ``dv`` needed or not):
  720 builds, about 3 minutes on 2 cores (measured 2026-12-07; every
  build compiles afresh, in a temporary Triton cache). Should that grow
  past ~4 minutes, restrict it to the models' own flags (polarity ``d =
  32`` without key bias, ``d = 64`` with it, PaCS with the rotary
  encoding and with scaled keys). The tool's default covers every width,
  dtype and flag (1620 builds, about 6 minutes).
- The check can fail: forced bad launch settings (32 registers a thread;
  eight pipeline stages of 128-token tiles; 16 warps of 255 registers)
  give a spilling build, one over the shared-memory limit and one over
  the register file, and exit status 1.

The tool runs in a subprocess without ``TRITON_INTERPRET`` (this suite's
conftest sets it for the kernel tests; the check needs compiled kernels).
The arithmetic (occupancy, ``cuobjdump`` parsing, traffic) is tested in
this process.
"""
import json
import os.path as osp
import subprocess
import sys
import textwrap

import pytest
from helpers import REPO, subprocess_env

from pola_mm.analysis import kernel_resources as kr
from pola_mm.ops.launch import TARGETS

triton = pytest.importorskip('triton')

pytestmark = [pytest.mark.slow, pytest.mark.kernels]

TOOL = osp.join(REPO, 'tools', 'analysis', 'kernel_resources.py')


def _env() -> dict:
    env = subprocess_env()
    env.pop('TRITON_INTERPRET', None)
    return env


def _tool(tmp_path, *args: str, timeout: int = 600):
    """Run the tool; its exit status, its rows (``--json``) and output."""
    out = tmp_path / f'rows{len(list(tmp_path.iterdir()))}.json'
    proc = subprocess.run(
        [sys.executable, TOOL, *args, '--json', str(out)], cwd=REPO,
        env=_env(), capture_output=True, text=True, timeout=timeout)
    rows = json.loads(out.read_text())['rows'] if out.exists() else None
    return proc.returncode, rows, proc.stdout + proc.stderr


# --- arithmetic, in this process -----------------------------------------


def test_occupancy_counts_registers_shared_memory_and_warps():
    # 128 registers x 32 threads = 16 allocation units of 256 a warp:
    # 16 warps by the register file; 4 warps a block -> 4 blocks
    assert kr.occupancy('sm_90', 128, 0, 4) == (16, 0.25)
    # 255 registers round up to 8192 a warp: 8 warps, one block of 8
    assert kr.occupancy('sm_86', 255, 0, 8) == (8, 8 / 48)
    # shared memory: 40 KB + 1 KB reserved a block, 100 KB a multiprocessor
    # on sm_86 -> 2 blocks; 228 KB on sm_90 -> 5 blocks
    assert kr.occupancy('sm_86', 32, 40 * 1024, 4)[0] == 8
    assert kr.occupancy('sm_90', 32, 40 * 1024, 4)[0] == 20
    # the warp limit: 48 on sm_89 whatever else fits
    assert kr.occupancy('sm_89', 16, 0, 8) == (48, 1.0)
    # over the multiprocessor's shared memory: nothing resident
    assert kr.occupancy('sm_86', 32, 120 * 1024, 4) == (0, 0.0)


def test_parse_res_usage_reads_cuobjdump():
    text = ('\nResource usage:\n Common:\n  GLOBAL:0\n Function _key_pass:\n'
            '  REG:255 STACK:152 SHARED:16 LOCAL:0 CONSTANT[0]:560 '
            'TEXTURE:0 SURFACE:0 SAMPLER:0\n')
    assert kr.parse_res_usage(text) == dict(registers=255, stack=152,
                                            shared_static=16, local=0)
    with pytest.raises(ValueError):
        kr.parse_res_usage('cuobjdump: no cubin')


def test_configurations_cover_every_flag_both_ways():
    configs = kr.configurations(('polarity', 'pacs'), (32, ), ('float16', ))
    assert {c.flags for c in configs if c.op == 'polarity'} == {
        (('bias', b), ('atomic', a), ('need_v', v)) for b in (0, 1)
        for a in (0, 1) for v in (0, 1)}
    assert {c.flags for c in configs if c.op == 'pacs'} == {
        (('rotary', r), ('scaled', s), ('atomic', a), ('need_v', v))
        for r in (0, 1) for s in (0, 1) for a in (0, 1) for v in (0, 1)}
    with pytest.raises(ValueError):
        kr.configurations(('softmax', ))
    # by default every head width the kernels take, the shipped ones among
    # them; a width they do not take is refused
    for op in kr.OPS:
        assert {32, 64} <= set(kr.head_widths(op))
        assert {c.d for c in kr.configurations((op, ))} == set(
            kr.head_widths(op))
        with pytest.raises(ValueError, match='do not take'):
            kr.configurations((op, ), (24, ))


def test_every_target_has_sm_limits():
    assert set(TARGETS) <= set(kr.SM_LIMITS)
    for name, target in TARGETS.items():
        # a block may use at most what the multiprocessor has, less 1 KB
        assert target.shared_memory == kr.SM_LIMITS[name].shared_memory - 1024


# --- the capture equals the JIT's own binding ----------------------------

_JIT_SCRIPT = textwrap.dedent('''
    import json
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from pola_mm.analysis import kernel_resources as kr
    from pola_mm.ops.launch import TARGETS, compiling_for

    configs = kr.configurations(('polarity', 'pacs'), (32, 64),
                                ('float32', 'float16', 'bfloat16'))
    mine = kr.capture_launches(configs, ['sm_90'])

    class Sm90:  # what JITFunction.run asks of the driver
        def get_current_device(self):
            return 0
        def get_current_stream(self, device):
            return 0
        def get_current_target(self):
            return GPUTarget('cuda', 90, 32)

    driver.set_active(Sm90())
    seen = []
    def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
        seen.append(compile)
        return True  # skip the compile: run returns without launching
    knobs.runtime.jit_cache_hook = hook
    with compiling_for(TARGETS['sm_90']):
        for c in configs:
            kr._call_op(c, kr._inputs(c, *kr.CAPTURE_SHAPE))

    def unit_int(a):  # a non-constexpr argument specialised as 1
        fn = kr._resolve(a.function)
        return any(not fn.params[k[0]].is_constexpr and v == 1
                   for k, v in a.constexprs.items())

    def plain(x):
        return json.loads(json.dumps(x, default=str))
    same = [a.signature == b['signature'] and a.constexprs == b['constants']
            and a.attrs == b['configs'][0] and plain(a.options) ==
            json.loads(b['specialization_data'])['options']
            for a, b in zip(mine, seen)]
    print(json.dumps(dict(
        captured=len(mine), jit=len(seen), same=sum(same),
        divisible=sum(bool(a.attrs) for a in mine),
        ones=sum(unit_int(a) for a in mine),
        stages=sorted({a.stage for a in mine}),
        warps=sorted({a.options['num_warps'] for a in mine}))))
''')


def test_capture_binds_each_launch_as_the_jit_does():
    proc = subprocess.run([sys.executable, '-c', _JIT_SCRIPT], cwd=REPO,
                          env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # 2 d x 3 dtypes x (8 polarity + 16 PaCS flag combinations) x 4
    # launches
    assert got['captured'] == got['jit'] == 576
    assert got['same'] == 576
    # not vacuous: the builds carry divisibility attributes and integer
    # arguments equal to 1 (unit strides) made constants
    assert got['divisible'] == 576 and got['ones'] == 576
    assert got['stages'] == sorted(kr.STAGES)


# --- the shipped models' builds pass; the check can fail ----------------

#: The shipped models' head widths (Pola-Swin 32, Pola-PVT 64, PolaPP 32
#: and 64) and the dtypes of float32 and fp16 training.
SHIPPED_WIDTHS = ('32', '64')
SHIPPED_DTYPES = ('float32', 'float16')
@pytest.mark.parametrize('op', kr.OPS)
def test_shipped_head_widths_pass_the_check(tmp_path, op):
    status, rows, output = _tool(tmp_path, '--ops', op, '--d',
                                 *SHIPPED_WIDTHS, '--dtypes',
                                 *SHIPPED_DTYPES)
    assert rows is not None, output[-3000:]
    bad = kr.failures(rows)
    assert not bad, (f'{op}: builds failing the check:\n' +
                     kr.format_table(bad) + '\n' + output[-1500:])
    assert status == 0, output[-1500:]
    # every launch of every configuration, on every target, is a build
    launched = {(tuple(sorted(flags.items())), r['d'], r['dtype'],
                 r['target'], r['kernel'])
                for r in rows for flags in r['configurations']}
    expected = {(tuple(sorted(dict(c.flags).items())), c.d, c.dtype, t, k)
                for c in kr.configurations((op, ),
                                           [int(d) for d in SHIPPED_WIDTHS],
                                           SHIPPED_DTYPES)
                for t in TARGETS for k in kr.STAGES}
    assert launched == expected
    for r in rows:
        assert r['shared'] <= r['limit'], r
        assert r['stack'] == 0, r
        assert r['limit'] == TARGETS[r['target']].shared_memory
        assert r['registers'] > 0 and r['occupancy_warps'] > 0


def test_check_fails_a_spilling_build(tmp_path):
    """32 registers a thread (a forced ``maxnreg``) cannot hold the key
    pass's two ``d x d`` float32 accumulators and its tiles: local memory,
    exit status 1."""
    status, rows, output = _tool(
        tmp_path, '--ops', 'polarity', '--d', '32', '--dtypes', 'float32',
        '--targets', 'sm_86', '--kernels', 'key_pass', '--flags', 'bias=0',
        'atomic=1', '--override', 'maxnreg=32')
    assert status == 1, output[-3000:]
    assert len(rows) == 1 and rows[0]['registers'] <= 32
    assert rows[0]['stack'] > 0 and 'spill' in rows[0]['status']
    assert 'spill' in output


def test_check_fails_a_build_over_the_shared_memory_limit(tmp_path):
    """Eight pipeline stages of 128-token float16 key and value tiles at
    ``d = 32`` (16 KB a stage, forced) exceed sm_86's 99 KB a block."""
    status, rows, output = _tool(
        tmp_path, '--ops', 'polarity', '--d', '32', '--dtypes', 'float16',
        '--targets', 'sm_86', '--kernels', 'key_pass', '--flags', 'bias=0',
        'atomic=1', '--override', 'BLOCK=128', 'num_stages=8')
    assert status == 1, output[-3000:]
    assert len(rows) == 1 and rows[0]['num_stages'] == 8
    assert rows[0]['block'] == 128
    assert rows[0]['shared'] > rows[0]['limit'] == 99 * 1024
    assert 'shared' in rows[0]['status']


def test_check_fails_a_block_over_the_register_file(tmp_path):
    """16 warps allowed 255 registers a thread (forced): the PaCS query
    backward at ``d = 64`` with the rotary tables takes more than 128, so
    one block of 512 threads needs more than an sm_86 multiprocessor's
    64K registers: occupancy 0, refused at launch, exit status 1."""
    status, rows, output = _tool(
        tmp_path, '--ops', 'pacs', '--d', '64', '--dtypes', 'float32',
        '--targets', 'sm_86', '--kernels', 'query_grad', '--flags',
        'rotary=1', 'scaled=0', 'atomic=1', '--override', 'num_warps=16',
        'maxnreg=255')
    assert status == 1, output[-3000:]
    assert len(rows) == 1 and rows[0]['num_warps'] == 16
    assert rows[0]['registers'] * 32 * 16 > 64 * 1024
    assert rows[0]['occupancy_warps'] == 0
    assert 'registers' in rows[0]['status']


def test_traffic_counts_the_token_maps(tmp_path):
    """``--traffic``: the forward's key pass reads ``k`` and ``v`` (plus
    the small parameters), the query pass writes ``x`` and ``1 / z``; the
    key pass's partial rows, one per chunk, are read back by torch, or,
    added atomically, are one row per image and head that torch does not
    copy; an argument the build does not use is not counted (PaCS's query
    backward reads ``x`` in float32 only)."""
    out = tmp_path / 'traffic.json'
    proc = subprocess.run(
        [sys.executable, TOOL, '--traffic', '--shape', '2,3,3136,32',
         '--dtypes', 'float16', 'float32', '--flags', 'need_v=1', 'bias=0',
         'rotary=0', 'scaled=0', '--json', str(out)],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'not a measurement' in proc.stdout
    everything = json.loads(out.read_text())
    reports = {(r['op'], r['dtype']): r for r in everything
               if r['flags']['atomic']}
    assert set(reports) == {(op, t) for op in kr.OPS
                            for t in ('float16', 'float32')}
    per_chunk = {(r['op'], r['dtype']): r for r in everything
                 if not r['flags']['atomic']}
    assert set(per_chunk) == set(reports)

    def token_map(dtype: str) -> int:
        return 2 * 3 * 3136 * 32 * (2 if dtype == 'float16' else 4)

    def launches(report: dict) -> dict:
        return {stage: (read, wrote)
                for _, stage, read, wrote in report['launches']}

    polarity = reports['polarity', 'float16']
    got = launches(polarity)
    assert set(got) == set(kr.STAGES)
    read, wrote = got['key_pass']
    assert 2 * token_map('float16') <= read < 2 * token_map('float16') + 1e4
    assert got['query_pass'][1] == token_map('float16') + 2 * 3 * 3136 * 2 * 4
    assert polarity['bound'] == dict(forward=4 * token_map('float16'),
                                     backward=7 * token_map('float16'))
    row = 2 * 32 * 32 + 2 * 32  # P, Q, kp, kn
    assert wrote == 2 * 3 * row * 4  # one float32 row per image and head
    assert polarity['glue']['forward'][0] < wrote  # not copied
    chunked = launches(per_chunk['polarity', 'float16'])['key_pass'][1]
    assert chunked > wrote  # a row per chunk, read back by torch's sum
    assert per_chunk['polarity', 'float16']['glue']['forward'][0] >= chunked
    # read: dx, q, (x,) 1 / z and the small rows, x only where it is
    # float32; written: the float32 dq that the two flows' programs add to
    # (torch casts it to the queries' dtype)
    half = launches(reports['pacs', 'float16'])['query_grad']
    full = launches(reports['pacs', 'float32'])['query_grad']
    assert 2 * token_map('float16') < half[0] < 3 * token_map('float16')
    assert 3 * token_map('float32') < full[0] < 4 * token_map('float32')
    assert half[1] >= token_map('float32') and full[1] >= token_map('float32')


def test_traffic_with_fewer_keys_than_queries(tmp_path):
    """A spatial reduction's keys (``--shape B,h,N,d,n``, Pola-PVT's): the
    key passes read ``n`` keys, the query passes ``N`` queries, and the
    bound counts each map at its own length."""
    B, h, N, d, n = 2, 1, 3136, 64, 49
    out = tmp_path / 'traffic.json'
    proc = subprocess.run(
        [sys.executable, TOOL, '--traffic', '--shape', f'{B},{h},{N},{d},{n}',
         '--ops', 'polarity', '--dtypes', 'float16', '--flags', 'bias=1',
         'need_v=1', 'atomic=1', '--json', str(out)],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report, = json.loads(out.read_text())
    queries, keys = B * h * N * d * 2, B * h * n * d * 2
    assert report['keys'] == n
    assert report['bound'] == dict(forward=2 * queries + 2 * keys,
                                   backward=3 * queries + 4 * keys)
    got = {stage: (read, wrote)
           for _, stage, read, wrote in report['launches']}
    # k, v and the key bias (one image's float32 table, broadcast over the
    # batch)
    assert 3 * keys <= got['key_pass'][0] < 4 * keys
    assert got['query_pass'][1] >= queries  # x
    # dk, dv and the chunks' small partial gradients of scale and power
    assert 2 * keys < got['key_grad'][1] < 3 * keys
    # the rotary tables need as many keys as queries
    proc = subprocess.run(
        [sys.executable, TOOL, '--traffic', '--shape', f'{B},{h},{N},{d},{n}',
         '--ops', 'pacs', '--dtypes', 'float16', '--flags', 'rotary=1',
         'need_v=1'], cwd=REPO, env=_env(), capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 2 and 'as many keys' in proc.stderr
    assert 'Traceback' not in proc.stderr
