"""The documented deploy of the untrained flagship on two real photos that
ship in installed packages: ``python -m pola_mm.deployment.deploy
pola_mm_deploy::mmdet/instance-seg/<the dynamic opset-16 config>
pola_mm::mask_rcnn_pola_swin_t.py none IMG IMG`` (README,
docs/deployment.md) with skimage's astronaut (512x512, H x W: the input
800x800, unpadded) and matplotlib's ``grace_hopper.jpg`` (600x512: resized
to 938x800, padded to the input 960x800, within which the exported graph
clips its boxes). One export verified on both (94 s on 2 busy cores, load
4); the same file with one weight tensor scaled by 1.01 refused (9 s)."""
import contextlib
import io
import re

import numpy as np
import pytest

mmdeploy = pytest.importorskip('mmdeploy')
# ruff: noqa: E402  (the imports below need MMDeploy)

from pola_mm.deployment.deploy import main, resolve_model_config
from pola_mm.deployment.mmdeploy_verify import verify_onnx_file

DEPLOY_CFG = ('pola_mm_deploy::mmdet/instance-seg/'
              'instance-seg_onnxruntime_dynamic-opset16.py')
MODEL_CFG = 'pola_mm::mask_rcnn_pola_swin_t.py'

pytestmark = [pytest.mark.slow, pytest.mark.export]


@pytest.fixture(scope='module')
def deployed(tmp_path_factory, photos):
    """The documented command, run once: its exit code, what it printed
    and its work dir."""
    work = tmp_path_factory.mktemp('deploy')
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([DEPLOY_CFG, MODEL_CFG, 'none', *photos, '--work-dir',
                   str(work), '--save-weights'])
    return rc, out.getvalue(), err.getvalue(), work


def test_untrained_flagship_verifies_on_two_real_photos(deployed):
    """Each photo: the top 20 of each side compared, all matched (the
    untrained heads score every class about 1/81, nothing reaches 0.3);
    the graph's padded frame (grace_hopper) said in its line; the weights
    said to be random and seeded."""
    rc, printed, err, work = deployed
    assert rc == 0, (printed + err)[-4000:]
    lines = printed.splitlines()
    counted = [ln for ln in lines if 'without a counterpart' in ln]
    assert [ln.split(':')[0] for ln in counted] == ['image 0 800x800',
                                                    'image 1 960x800']
    for line in counted:
        assert line.endswith(' ok'), line
        top = re.search(r"compared PyTorch's top (\d+) of (\d+) and the "
                        r"backend's top (\d+) of (\d+)", line)
        assert top and int(top[1]) == int(top[3]) == 20, line
    assert 'padded input' not in counted[0]
    assert ('boxes clipped to the padded input 960x800 on both sides, as '
            'in the exported graph (the resized image: 938x800)'
            in counted[1])
    assert lines[-2] == ('weights: random, seeded (--seed 0); saved to '
                         f'{work / "end2end.pth"}')
    assert lines[-1] == (f'verified: {work / "end2end.onnx"} '
                         '(InstanceSegmentation, input 800x800, 960x800); '
                         '40 PyTorch and 40 ONNX Runtime detections '
                         'compared')


def test_a_perturbed_file_is_refused(deployed, photos, tmp_path):
    """The verified file with its first layer's weights (the patch
    embedding's, which every output depends on) scaled by 1.01: on the
    astronaut the scores and masks move beyond the tolerances."""
    import onnx
    from onnx import numpy_helper
    rc, _, _, work = deployed
    assert rc == 0
    model = onnx.load(str(work / 'end2end.onnx'))
    name = 'backbone.patch_embed.proj.weight'
    [init] = [t for t in model.graph.initializer if t.name == name]
    init.CopyFrom(numpy_helper.from_array(
        (numpy_helper.to_array(init) * 1.01).astype(np.float32), name))
    perturbed = str(tmp_path / 'perturbed.onnx')
    onnx.save(model, perturbed)
    report = verify_onnx_file(DEPLOY_CFG, resolve_model_config(MODEL_CFG),
                              str(work / 'end2end.pth'), perturbed,
                              photos[:1])
    assert not report.ok
    failed = {c.name.split(': ', 1)[1] for c in report.checks if not c.ok}
    assert 'score max abs diff' in failed, [str(c) for c in report.checks]


def test_pytorch_runs_in_the_graphs_frame():
    """``in_input_frame``: an image padded to the input (938x800 in
    960x800) is given the input's ``img_shape``, in a copy; an image that
    fills the input is left as it is."""
    from mmdet.structures import DetDataSample

    from pola_mm.deployment.mmdeploy_verify import in_input_frame
    sample = DetDataSample(metainfo=dict(img_shape=(938, 800),
                                         ori_shape=(600, 512)))
    raw = dict(inputs=[None], data_samples=[sample])
    framed, padded_from = in_input_frame(raw, (960, 800))
    assert padded_from == (938, 800)
    assert framed['data_samples'][0].img_shape == (960, 800)
    assert framed['data_samples'][0].ori_shape == (600, 512)
    assert sample.img_shape == (938, 800)  # the caller's data unchanged
    assert in_input_frame(raw, (938, 800)) == (raw, None)
