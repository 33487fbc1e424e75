"""FLOPs and parameters: the polarity attention's formula against
``torch.utils.flop_counter.FlopCounterMode`` on the plain path, softmax
attention (explicit and ``scaled_dot_product_attention``),
``tools/analysis/get_flops.py`` on tiny classifier, detector and segmentor
configs, two-stage RoI heads on the test pass's RoIs, shapes-only counts,
and mmdet's Swin-T Mask R-CNN and Cascade Mask R-CNN against the Swin
paper."""
import importlib
import importlib.util
import json
import os.path as osp

import pytest
import torch
import torch.nn.functional as F
from helpers import PVT_TINY, REPO, SWIN_TINY_DEPTH1, randomise_attention
from torch.utils.flop_counter import FlopCounterMode

import pola_mm  # noqa: F401
from pola_mm.analysis.flops import (FORMULAS, count_flops,
                                    pacs_attention_flops,
                                    polarity_attention_flops, register_formula,
                                    softmax_attention_flops)
from pola_mm.models.backbones import PolaPVT, PolaSwinTransformer
from pola_mm.models.layers import PolarityAttention, WindowMSA
from pola_mm.ops import use_implementation

pytestmark = pytest.mark.slow


def _attention(C: int, h: int, hw, fused: bool, kernel: int = 5):
    attn = PolarityAttention(C, h, hw, fused_qkvg=fused, kernel_size=kernel)
    randomise_attention(attn)
    return attn


def _linears(B: int, N: int, C: int) -> int:
    """The attention's projections: qkvg (or qg + kv) and proj."""
    return B * N * C * 4 * C + B * N * C * C


def _references_restored() -> bool:
    """After a count, the ops' modules hold their own functions again."""
    mods = [importlib.import_module('pola_mm.ops.polarity.op'),
            importlib.import_module('pola_mm.ops.pacs.op')]
    return all(vars(m)[fn.__name__] is fn for fn in FORMULAS for m in mods
               if fn.__name__ in vars(m))


def test_formula_by_hand():
    # B=1, N=4, C=4, h=2 (d=2), kernel 3, from the docstring's terms
    f = polarity_attention_flops(1, 4, 4, 2, kernel_size=3)
    assert f['products'] == 4 * 4 * 4 * 2 + 4 * 4 * 4  # 2BNCd*2 + 4BNC
    assert f['conv'] == 4 * 4 * 9
    assert f['elementwise'] == 14 * 4 * 4 + 4 * 2 * 4
    assert f['total'] == f['products'] + f['conv'] + f['elementwise']
    assert softmax_attention_flops(2, 3, 49, 49, 32) == 2 * 3 * 49 * 49 * 64


@pytest.mark.parametrize('C,h,hw,fused,kernel', [
    (16, 1, (5, 7), True, 5), (32, 4, (6, 6), False, 3),
    (24, 3, (1, 9), True, 5)])
def test_formula_matches_flop_counter_mode_on_plain_path(
        C, h, hw, fused, kernel):
    """The formula's products and conv are what torch's own counter sees in
    the published formula (2 FLOPs per multiply-add there), plus 2BNC
    multiply-adds: the plain reference computes the normalisers as matrix
    products (a row of ones times the key features, and two more columns
    of the query products), 6BNC where the formula counts the 4BNC the
    normalisers need."""
    attn = _attention(C, h, hw, fused, kernel)
    B, N = 2, hw[0] * hw[1]
    x = torch.randn(B, N, C)
    with use_implementation('graph'), torch.no_grad(), \
            FlopCounterMode(display=False) as m:
        attn(x, hw)
    f = polarity_attention_flops(B, N, C, h, kernel)
    assert m.get_total_flops() == 2 * (f['products'] + f['conv']
                                       + _linears(B, N, C) + 2 * B * N * C)


@pytest.mark.parametrize('grad', [False, True])
@pytest.mark.parametrize('fast_paths', [False, True])
def test_polarity_attention_counted_with_grad_on_and_off(grad, fast_paths):
    """The count is the formula plus the projections, whichever
    implementation runs (the fast kernel's autograd function included) and
    whether or not gradients are on."""
    C, h, hw, B = 32, 2, (7, 9), 2
    N = hw[0] * hw[1]
    attn = _attention(C, h, hw, fused=True)
    x = torch.randn(B, N, C, requires_grad=grad)
    with torch.set_grad_enabled(grad):
        report = count_flops(attn, lambda: attn(x, hw),
                             fast_paths=fast_paths)
    f = polarity_attention_flops(B, N, C, h)
    assert f['total'] > 0
    # the op by its formula, the depth-wise conv on v as a conv
    assert report.by_op['polarity_attention'] + report.by_op[
        'convolution'] == f['total']
    assert report.by_op['convolution'] == f['conv']
    assert report.total == f['total'] + _linears(B, N, C)
    assert report.by_module['qkvg'] == B * N * C * 4 * C
    assert report.params[''] == sum(p.numel() for p in attn.parameters())
    # the op's references are their own again
    assert _references_restored()


def _window_msa_flops(fused: bool) -> int:
    """Windows of 7 on a 14 x 14 map: 4 windows; with ``fused`` the fast
    paths on (no gradients: ``scaled_dot_product_attention``), else the
    explicit reference."""
    C, h, win, nW = 24, 3, (7, 7), 4
    msa = WindowMSA(C, h, win)
    x = torch.randn(1, 14 * 14, C)
    with torch.no_grad():
        report = count_flops(msa, lambda: msa(x, (14, 14)), fast_paths=fused)
    sdpa = report.by_op.get('_scaled_dot_product_flash_attention_for_cpu')
    if fused:
        assert sdpa == softmax_attention_flops(nW, h, 49, 49, C // h)
    else:
        assert sdpa is None
    return report.total


def test_softmax_window_attention_sdpa_counted():
    """Swin's softmax windows cost the same whether computed explicitly
    (CPU training) or by scaled_dot_product_attention (GPUs, CPU
    inference): two products plus the qkv and output linears."""
    explicit = _window_msa_flops(fused=False)
    fused = _window_msa_flops(fused=True)
    nW, N, C, h = 4, 49, 24, 3
    expected = (softmax_attention_flops(nW, h, N, N, C // h)
                + nW * N * C * 3 * C + nW * N * C * C)
    assert explicit == fused == expected


def test_sdpa_call_counted():
    q = torch.randn(2, 4, 10, 8)
    k = torch.randn(2, 4, 6, 8)
    v = torch.randn(2, 4, 6, 16)
    mod = torch.nn.Identity()
    report = count_flops(mod, lambda: F.scaled_dot_product_attention(q, k, v))
    assert report.total == 2 * 4 * 10 * 6 * (8 + 16)


@pytest.mark.parametrize('family', ['swin', 'pvt'])
def test_backbone_agrees_with_flop_counter_mode(family):
    """Whole tiny backbones: our count minus the norms, the formula's
    elementwise terms and the tables' resizing is torch's count on the plain
    path (halved)."""
    H, W = 64, 96
    if family == 'swin':
        model = PolaSwinTransformer(arch=SWIN_TINY_DEPTH1)
    else:
        model = PolaPVT(arch=PVT_TINY)
    model.eval()
    randomise_attention(model)
    x = torch.randn(1, 3, H, W)
    with torch.no_grad():
        report = count_flops(model, lambda: model(x))
        with use_implementation('graph'), FlopCounterMode(display=False) as m:
            model(x)
    elementwise = extra = 0
    attn_names = []
    for name, mod in model.named_modules():
        if isinstance(mod, PolarityAttention):
            attn_names.append(name)
    assert attn_names
    # the stage maps of polarity stages: strides 4, 8, 16, 32
    for name in attn_names:
        mod = model.get_submodule(name)
        # 'layers.{i}.blocks.{j}.attn' (Swin), 'block{i+1}.{j}.attn' (PVT)
        stage = (int(name.split('.')[1]) if family == 'swin' else
                 int(name.split('.')[0][len('block'):]) - 1)
        s = 4 * 2 ** stage
        N = -(-H // s) * -(-W // s)
        f = polarity_attention_flops(1, N, mod.embed_dims, mod.num_heads)
        elementwise += f['elementwise']
        # the plain reference's normalisers as products: 2NC multiply-adds
        # more than the formula (test_formula_matches_flop_counter_mode_...)
        sums_as_products = 2 * N * mod.embed_dims
        extra += sums_as_products
        # per module: the attention's count is the formula plus linears
        torch_count = sum(m.get_flop_counts().get(
            f'{type(model).__name__}.{name}', {}).values())
        assert report.by_module[name] - f['elementwise'] + \
            sums_as_products == torch_count // 2
    norms = report.by_op.get('native_layer_norm', 0)
    # torch's counter does not count the resizing of the position tables
    resize = sum(v for k, v in report.by_op.items()
                 if k.startswith('upsample_'))
    assert report.total - norms - elementwise - resize + extra == \
        m.get_total_flops() // 2
    assert report.by_op['polarity_attention'] > 0


def _get_flops_tool():
    path = osp.join(REPO, 'tools', 'analysis', 'get_flops.py')
    spec = importlib.util.spec_from_file_location('get_flops_tool', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _arch_options(dims, depths, heads, mlp=None):
    opts = ['model.backbone.arch._delete_=True',
            f'model.backbone.arch.embed_dims={dims}',
            f'model.backbone.arch.depths={list(depths)}',
            f'model.backbone.arch.num_heads={list(heads)}']
    if mlp is not None:
        opts.append(f'model.backbone.arch.mlp_ratios={list(mlp)}')
    return [o.replace(' ', '') for o in opts]


SWIN_OPTS = _arch_options(16, SWIN_TINY_DEPTH1['depths'],
                          SWIN_TINY_DEPTH1['num_heads'])
PVT_OPTS = _arch_options(list(PVT_TINY['embed_dims']), PVT_TINY['depths'],
                         PVT_TINY['num_heads'], PVT_TINY['mlp_ratios'])


@pytest.mark.parametrize('config,opts,shape,kind,backbone', [
    ('pola_swin_t_in1k.py', SWIN_OPTS + ['model.head.in_channels=128'],
     (64, 64), 'classifier', ('swin', SWIN_TINY_DEPTH1)),
    ('pola_pvt_t_in1k.py', PVT_OPTS + ['model.head.in_channels=64'],
     (64, 96), 'classifier', ('pvt', PVT_TINY)),
    ('mask_rcnn_pola_swin_t.py',
     SWIN_OPTS + ['model.neck.in_channels=[16,32,64,128]',
                  # fewer proposals: the box and mask heads run on them
                  'model.test_cfg.rpn.max_per_img=20'], (96, 128),
     'detector', None),
    ('sem_fpn_pola_pvt_t_ade20k.py',
     PVT_OPTS + ['model.neck.in_channels=[16,32,32,64]'], (64, 64),
     'segmentor', None),
])
def test_get_flops_tool(tmp_path, capsys, config, opts, shape, kind,
                        backbone):
    tool = _get_flops_tool()
    out = tmp_path / 'flops.json'
    rc = tool.main([osp.join(REPO, 'configs', config), '--shape',
                    str(shape[0]), str(shape[1]), '--json', str(out),
                    '--cfg-options', *opts])
    assert rc == 0
    text = capsys.readouterr().out
    assert f'({kind};' in text and 'backbone' in text
    assert 'polarity attention (formula)' in text
    res = json.loads(out.read_text())
    assert res['kind'] == kind and res['shape'] == list(shape)
    by_module = res['by_module']
    assert res['flops'] == by_module[''] > by_module['backbone'] > 0
    assert res['by_op']['polarity_attention'] > 0
    assert res['params'][''] > res['params']['backbone'] > 0
    parts = [p for p in ('backbone', 'neck', 'head', 'rpn_head', 'roi_head',
                         'decode_head') if p in by_module]
    assert sum(by_module[p] for p in parts) <= res['flops']
    if kind == 'detector':
        assert by_module['roi_head'] > 0 and by_module['rpn_head'] > 0
        # the mask head on no more RoIs than there are proposals
        assert res['rois'] == {'proposals': 20, 'detections': 20}
        assert 'on 20 proposals' in text
    else:
        assert res['rois'] == {}
    if kind == 'segmentor':
        assert by_module['decode_head'] > 0
    if backbone is not None:
        # the backbone inside the classifier counts as the bare backbone
        family, arch = backbone
        cls = PolaSwinTransformer if family == 'swin' else PolaPVT
        bare = cls(arch=arch, out_indices=(3,)).eval()
        x = torch.randn(1, 3, *shape)
        with torch.no_grad():
            expected = count_flops(bare, lambda: bare(x))
        assert by_module['backbone'] == expected.total
        assert res['params']['backbone'] == expected.params['']


def test_get_flops_tool_bad_input(tmp_path, capsys):
    from mmengine.logging import MMLogger

    # mmpretrain logs through the latest MMLogger: one made now writes to
    # this test's captured streams, not to an earlier test's closed ones
    MMLogger.get_instance('test_get_flops_tool_bad_input')
    tool = _get_flops_tool()
    # configs of installed packages by their mim names
    path = tool.resolve_config(
        'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py')
    assert osp.isfile(path) and path.endswith('fpn_1x_coco.py')
    assert tool.resolve_config('configs/x.py') == 'configs/x.py'
    rc = tool.main([str(tmp_path / 'missing.py')])
    assert rc == 2 and 'config file not found' in capsys.readouterr().err
    rc = tool.main([osp.join(REPO, 'configs', 'pola_swin_t_in1k.py'),
                    '--shape', '1', '2', '3'])
    assert rc == 2 and '--shape takes H W' in capsys.readouterr().err
    # config mistakes: one line, nothing built
    config = osp.join(REPO, 'configs', 'pola_swin_t_in1k.py')
    rc = tool.main([config, '--cfg-options', 'model.backbone.type=PolaPvt'])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "unknown type 'PolaPvt'" in err and "'PolaPVT'" in err
    rc = tool.main([config, '--cfg-options', 'model.backbone.windo_size=7'])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "takes no argument 'windo_size'; did you mean 'window_size'" in err


def _pacs_module(kind: str, C: int, h: int, hw, kernel: int):
    """PolaPP's PaCSAttention or PolarityAttention(feature_map='pacs'),
    with non-zero temperatures."""
    from pola_mm.models.layers import PaCSAttention
    if kind == 'polapp':
        attn = PaCSAttention(C, h, kernel_size=kernel)
    else:
        attn = PolarityAttention(C, h, hw, kernel_size=kernel,
                                 feature_map='pacs')
    with torch.no_grad():
        attn.s1.normal_()
        attn.s2.normal_()
    return attn


def test_pacs_formula_by_hand():
    # B=1, N=4, C=4, h=2 (d=2), kernel 3
    f = polarity_attention_flops(1, 4, 4, 2, kernel_size=3)
    for rotary, scaled, per_token in [(False, False, 17), (True, False, 35),
                                      (False, True, 20)]:
        p = pacs_attention_flops(1, 4, 4, 2, 3, rotary=rotary,
                                 scaled_inputs=scaled)
        assert (p['products'], p['conv']) == (f['products'], f['conv'])
        assert p['elementwise'] == per_token * 16 + 4 * 2 * 4
        assert p['total'] == p['products'] + p['conv'] + p['elementwise']


@pytest.mark.parametrize('kind,C,h,hw,kernel', [
    ('polapp', 16, 1, (5, 7), 5), ('polapp', 32, 4, (6, 6), 3),
    ('pola', 24, 3, (1, 9), 5)])
def test_pacs_formula_matches_flop_counter_mode_on_plain_path(
        kind, C, h, hw, kernel):
    """Products and conv of the PaCS formula (rotary for PolaPP) are what
    torch's own counter sees in the plain formula."""
    attn = _pacs_module(kind, C, h, hw, kernel)
    B, N = 2, hw[0] * hw[1]
    x = torch.randn(B, N, C)
    with use_implementation('graph'), torch.no_grad(), \
            FlopCounterMode(display=False) as m:
        attn(x, hw)
    f = pacs_attention_flops(B, N, C, h, kernel, rotary=kind == 'polapp',
                             scaled_inputs=kind == 'pola')
    assert m.get_total_flops() == 2 * (f['products'] + f['conv']
                                       + _linears(B, N, C))


@pytest.mark.parametrize('kind', ['polapp', 'pola'])
@pytest.mark.parametrize('grad,fast_paths', [(False, True), (True, True),
                                             (True, False)])
def test_pacs_attention_counted_whatever_runs(kind, grad, fast_paths):
    """The count is the formula plus the projections with the PaCS kernel
    (its autograd function too) or the plain formula."""
    C, h, hw, B = 32, 2, (7, 9), 2
    N = hw[0] * hw[1]
    attn = _pacs_module(kind, C, h, hw, 5)
    x = torch.randn(B, N, C, requires_grad=grad)
    with torch.set_grad_enabled(grad):
        report = count_flops(attn, lambda: attn(x, hw),
                             fast_paths=fast_paths)
    f = pacs_attention_flops(B, N, C, h, rotary=kind == 'polapp',
                             scaled_inputs=kind == 'pola')
    # the op by its formula, the depth-wise conv on v as a conv
    assert report.by_op['pacs_attention'] + report.by_op[
        'convolution'] == f['total']
    assert report.by_op['convolution'] == f['conv']
    assert 'polarity_attention' not in report.by_op
    assert report.total == f['total'] + _linears(B, N, C)
    assert _references_restored()


def my_attention(q, k, v):
    """A user's own op (called through this module's global)."""
    return (q @ k.transpose(-2, -1)) @ v


def test_any_registered_function_is_charged_its_own_formula(monkeypatch):
    """The counter takes an op's cost from the formula registered for it:
    a user's function registered with ``register_formula`` is charged what
    its formula says, in place of the operations it runs, and is itself
    again after the count."""

    class MyAttention(torch.nn.Module):

        def forward(self, x):
            return my_attention(x, x, x)

    monkeypatch.setitem(FORMULAS, my_attention, None)  # removed after
    register_formula('my_attention', my_attention)(
        lambda args, caller: 1234 * args['q'].shape[0] * args['q'].shape[1])
    mod = MyAttention()
    x = torch.randn(2, 5, 4)
    report = count_flops(mod, lambda: mod(x))
    assert report.by_op == {'my_attention': 1234 * 2 * 5}
    assert report.by_module[''] == report.total == 1234 * 2 * 5
    assert globals()['my_attention'] is my_attention  # itself again


# -- two-stage detectors: the RoIs of the test pass ---------------------------
def _config(path, opts=()):
    """A config (ours, or ``mmdet::...``) with ``--cfg-options`` applied, as
    get_flops.py reads it."""
    from pola_mm.models.from_config import load_config
    tool = _get_flops_tool()
    args = tool.parse_args([path, '--cfg-options', *opts] if opts else
                           [path])
    return load_config(tool.resolve_config(args.config), args.cfg_options)


TINY_DET_OPTS = SWIN_OPTS + ['model.neck.in_channels=[16,32,64,128]',
                             'model.test_cfg.rpn.max_per_img=20',
                             'model.test_cfg.rcnn.max_per_img=5']


def _per_roi(head, size: int) -> int:
    """FLOPs of a box or mask head on one RoI feature (256 x size x size)."""
    x = torch.randn(1, 256, size, size)
    with torch.no_grad():
        return count_flops(head, lambda: head(x)).total


@pytest.mark.parametrize('config,stages,batch', [
    ('mask_rcnn_pola_swin_t.py', 1, 1),
    ('cascade_mask_rcnn_pola_swin_t.py', 3, 2)])
def test_roi_heads_run_on_the_test_pass_rois(config, stages, batch):
    """Every box head stage runs on the RPN's ``test_cfg.rpn.max_per_img``
    proposals per image and every mask head (the three of a cascade, as
    mmdet's ``predict_mask`` runs and averages them) on
    ``test_cfg.rcnn.max_per_img`` detections per image, nothing more:
    the RoI head costs exactly that many times its heads' cost per RoI."""
    from pola_mm.analysis.flops import model_complexity
    cfg = _config(osp.join(REPO, 'configs', config), TINY_DET_OPTS)
    model, report, kind = model_complexity(cfg, (96, 128), batch=batch)
    assert kind == 'detector'
    assert report.rois == {'proposals': 20, 'detections': 5}
    roi_head = model.roi_head
    expected = 0
    for i in range(stages):
        box = roi_head.bbox_head[i] if stages > 1 else roi_head.bbox_head
        mask = roi_head.mask_head[i] if stages > 1 else roi_head.mask_head
        suffix = f'.{i}' if stages > 1 else ''
        box_flops = batch * 20 * _per_roi(box, 7)
        mask_flops = batch * 5 * _per_roi(mask, 14)
        assert report.by_module['roi_head.bbox_head' + suffix] == box_flops
        assert report.by_module['roi_head.mask_head' + suffix] == mask_flops
        expected += box_flops + mask_flops
    assert report.by_module['roi_head'] == expected  # RoIAlign: not counted
    # the model's own methods again after the count
    assert 'predict' not in vars(model.rpn_head)
    assert '_mask_forward' not in vars(roi_head)


@pytest.mark.parametrize('config,opts,shape', [
    ('pola_pvt_t_in1k.py', PVT_OPTS + ['model.head.in_channels=64'],
     (64, 96)),
    ('cascade_mask_rcnn_pola_swin_t.py', TINY_DET_OPTS, (96, 128)),
    ('sem_fpn_pola_pvt_t_ade20k.py',
     PVT_OPTS + ['model.neck.in_channels=[16,32,32,64]'], (64, 64))])
def test_shapes_only_count_is_the_computed_count(config, opts, shape):
    """``compute=False`` (products and convs not computed, zeros of their
    shape) counts exactly what the computed forward counts."""
    from pola_mm.analysis.flops import model_complexity
    cfg = _config(osp.join(REPO, 'configs', config), opts)
    _, computed, _ = model_complexity(cfg, shape)
    _, shapes_only, _ = model_complexity(cfg, shape, compute=False)
    assert computed.total > 0
    assert shapes_only.by_module == computed.by_module
    assert shapes_only.by_op == computed.by_op
    assert shapes_only.rois == computed.rois


def _cascade_swin_t():
    """Cascade Mask R-CNN Swin-T as the Swin paper counts it: mmdet's own
    Cascade Mask R-CNN with mmdet's Swin-T backbone (as in mmdet's Mask
    R-CNN Swin-T config) and the Swin detection recipe's box heads: 4
    shared 3x3 convs (SyncBN) + 1 fc in each stage, class-specific GIoU
    regression."""
    cfg = _config('mmdet::cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco.py')
    swin = _config('mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py')
    cfg.model.backbone = swin.model.backbone
    cfg.model.neck.in_channels = swin.model.neck.in_channels
    heads = []
    for head in cfg.model.roi_head.bbox_head:
        head = dict(head, type='Shared4Conv1FCBBoxHead',
                    conv_out_channels=256,
                    norm_cfg=dict(type='SyncBN', requires_grad=True),
                    reg_class_agnostic=False, reg_decoded_bbox=True,
                    loss_bbox=dict(type='GIoULoss', loss_weight=10.0))
        heads.append(head)
    cfg.model.roi_head.bbox_head = heads
    return cfg


#: The Swin paper's Swin-T detectors on COCO at 1280 x 800 (GFLOPs,
#: M parameters): Mask R-CNN 264 G, 48 M; Cascade Mask R-CNN 745 G, 86 M.
SWIN_PAPER = {'mask_rcnn': (264, 48), 'cascade_mask_rcnn': (745, 86)}


def test_published_swin_t_detectors_reproduced():
    """mmdet's own Mask R-CNN Swin-T config and Cascade Mask R-CNN Swin-T
    at 1280 x 800 count within 3% of the Swin paper's FLOPs and parameters
    (FLOPs without computing the products: see the test above)."""
    from pola_mm.analysis.flops import model_complexity
    configs = {
        'mask_rcnn': _config(
            'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'),
        'cascade_mask_rcnn': _cascade_swin_t()}
    for name, cfg in configs.items():
        _, report, kind = model_complexity(cfg, (800, 1280), compute=False)
        assert kind == 'detector'
        assert report.rois == {'proposals': 1000, 'detections': 100}
        flops, params = SWIN_PAPER[name]
        assert report.total / 1e9 == pytest.approx(flops, rel=0.03), name
        assert report.params[''] / 1e6 == pytest.approx(params, rel=0.03), \
            name
