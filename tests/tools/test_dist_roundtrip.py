"""The launch scripts, end to end, with 2 processes (gloo when no GPU).

``tools/dist_train.sh`` trains RetinaNet / Pola-PVT (the real config, shrunk
as in the e2e tests) and checkpoints; ``tools/test.py`` and
``tools/dist_test.sh`` evaluate the checkpoint; ``--resume`` continues the
run from it. The slurm scripts are run through a stand-in ``srun`` that
records its command line (there is no Slurm here).
"""
import os
import os.path as osp
import pickle
import re
import subprocess
import sys

import e2e_data
import pytest
from helpers import REPO, subprocess_env

pytest.importorskip('mmdet.models')

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def _run(cmd, cwd, timeout=300, **env):
    proc = subprocess.run(cmd, cwd=cwd,
                          env=subprocess_env(launcher=True, **env),
                          timeout=timeout, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, f'{cmd} failed:\n{proc.stdout[-6000:]}'
    return proc.stdout


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory):
    """Data, the shrunk config, and a 2-process training run (2 epochs)."""
    root = tmp_path_factory.mktemp('dist')
    data = e2e_data.make_coco(str(root / 'coco'))
    work_dir = str(root / 'work')
    cfg = e2e_data.tiny_det(
        e2e_data.load('retinanet_pola_pvt_t.py'), data, work_dir, epochs=2)
    cfg.log_level = 'INFO'
    cfg.default_hooks.checkpoint.interval = 1
    # 4 iterations do not lift scores over 0.05: keep every box so that
    # the evaluation has predictions to score
    cfg.model.test_cfg.score_thr = 0.0
    cfg_path = str(root / 'retinanet_tiny.py')
    cfg.dump(cfg_path)
    out = _run(['bash', osp.join(REPO, 'tools', 'dist_train.sh'), cfg_path,
                '2'], cwd=str(root))
    return dict(root=str(root), cfg=cfg_path, work_dir=work_dir, log=out,
                num_images=8)


def test_dist_train_checkpoints(run_dir):
    log = run_dir['log']
    # mmengine's runtime report: 2 processes in one process group
    assert 'Distributed training: True' in log, log[-3000:]
    assert 'GPU number: 2' in log, log[-3000:]
    for epoch in (1, 2):
        assert osp.isfile(osp.join(run_dir['work_dir'], f'epoch_{epoch}.pth'))
    # each process saw half the data: 8 images / (2 x 2) = 2 iters/epoch
    assert re.search(r'Epoch\(train\) +\[2\]\[2/2\]', log), log[-3000:]
    assert not re.search(r'Epoch\(train\) +\[1\]\[3/', log)


def _check_results(path: str, n: int) -> None:
    with open(path, 'rb') as f:
        results = pickle.load(f)
    assert len(results) == n
    assert 'pred_instances' in results[0]


def test_single_process_test_tool(run_dir):
    ckpt = osp.join(run_dir['work_dir'], 'epoch_2.pth')
    out_pkl = osp.join(run_dir['root'], 'single.pkl')
    log = _run([sys.executable, osp.join(REPO, 'tools', 'test.py'),
                run_dir['cfg'], ckpt, '--out', out_pkl,
                '--work-dir', osp.join(run_dir['root'], 'test_single')],
               cwd=run_dir['root'])
    assert 'coco/bbox_mAP' in log, log[-3000:]
    _check_results(out_pkl, run_dir['num_images'])


def test_dist_test_script(run_dir):
    ckpt = osp.join(run_dir['work_dir'], 'epoch_2.pth')
    out_pkl = osp.join(run_dir['root'], 'dist.pkl')
    log = _run(['bash', osp.join(REPO, 'tools', 'dist_test.sh'),
                run_dir['cfg'], ckpt, '2', '--out', out_pkl,
                '--work-dir', osp.join(run_dir['root'], 'test_dist')],
               cwd=run_dir['root'])
    assert 'coco/bbox_mAP' in log, log[-3000:]
    # the distributed sampler's shards are gathered back: every image once
    _check_results(out_pkl, run_dir['num_images'])


def test_dist_train_resumes(run_dir):
    ckpt = osp.join(run_dir['work_dir'], 'epoch_2.pth')
    log = _run(['bash', osp.join(REPO, 'tools', 'dist_train.sh'),
                run_dir['cfg'], '2', '--resume', ckpt,
                '--cfg-options', 'train_cfg.max_epochs=3'],
               cwd=run_dir['root'])
    assert 'resumed epoch: 2' in log.lower() or \
        f'Load checkpoint from {ckpt}' in log, log[-3000:]
    assert osp.isfile(osp.join(run_dir['work_dir'], 'epoch_3.pth'))
    assert re.search(r'Epoch\(train\) +\[3\]\[2/2\]', log), log[-3000:]
    assert not re.search(r'Epoch\(train\) +\[[12]\]', log), \
        'training restarted instead of resuming'


@pytest.mark.parametrize('script, extra', [
    ('slurm_train.sh', ['WORK']),
    ('slurm_test.sh', ['CKPT']),
])
def test_slurm_scripts_call_srun(script, extra, tmp_path):
    """A stand-in ``srun`` records the command line the script builds."""
    fake = tmp_path / 'bin'
    fake.mkdir()
    (fake / 'srun').write_text(
        '#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$SRUN_LOG"\n')
    (fake / 'srun').chmod(0o755)
    log = tmp_path / 'srun.log'
    _run(['bash', osp.join(REPO, 'tools', script), 'part', 'job', 'CFG.py',
          *extra, '--cfg-options', 'a=1'], cwd=str(tmp_path),
         PATH=f'{fake}:{os.environ["PATH"]}', SRUN_LOG=str(log),
         GPUS='16', GPUS_PER_NODE='8', CPUS_PER_TASK='3',
         SRUN_ARGS='--qos=low')
    args = log.read_text().split('\n')
    assert args[:2] == ['-p', 'part']
    for flag in ('--job-name=job', '--gres=gpu:8', '--ntasks=16',
                 '--ntasks-per-node=8', '--cpus-per-task=3', '--qos=low',
                 '--launcher=slurm', 'CFG.py', 'a=1'):
        assert flag in args, (flag, args)
    tool = 'train.py' if 'train' in script else 'test.py'
    assert any(a.endswith(osp.join('tools', tool)) for a in args)
    if tool == 'train.py':
        assert '--work-dir=WORK' in args
    else:
        assert 'CKPT' in args
    # GRES= (empty) requests no GPUs, e.g. on a CPU partition
    _run(['bash', osp.join(REPO, 'tools', script), 'part', 'job', 'CFG.py',
          *extra], cwd=str(tmp_path), PATH=f'{fake}:{os.environ["PATH"]}',
         SRUN_LOG=str(log), GRES='')
    assert not any(a.startswith('--gres') for a in log.read_text().split())
