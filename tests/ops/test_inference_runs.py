"""Inference on CPU runs the global polarity attention of Pola-Swin and
Pola-PVT blocks on runs of grid rows and the feed-forward half of every
block on runs of tokens; all must give the whole-map results, and training
must keep the whole-map path."""

import pytest
import torch

import pola_mm.models.layers.embed as embed
from pola_mm.ops import dispatch
from pola_mm.models import PolaPVT, PolaSwinTransformer
from pola_mm.models.backbones.pola_pvt import PolaPVTBlock
from pola_mm.models.backbones.pola_swin import PolaSwinBlock
from pola_mm.models.layers import Mlp, PolarityAttention
from pola_mm.ops.polarity_kernel import (polarity_attention_kernel,
                                         polarity_key_state,
                                         polarity_query_apply)
from helpers import (PVT_TINY, SWIN_TINY_DEPTH2, count_calls,
                     randomise_attention)


def _run_sizes(monkeypatch, small: bool) -> None:
    """Tiny runs (every inference path taken at test sizes), or none at all
    (the one-shot computation)."""
    big = 1 << 40
    monkeypatch.setattr(dispatch, 'ATTN_RUN_ELEMENTS',
                        1600 if small else big)
    monkeypatch.setattr(dispatch, 'FFN_RUN_ELEMENTS',
                        256 if small else big)
    monkeypatch.setattr(dispatch, 'NORM_RUN_ELEMENTS', 256 if small else big)
    monkeypatch.setattr(dispatch, 'FFN_MIN_TOKENS', 7)


@pytest.mark.parametrize('hw', [(30, 41), (28, 28), (9, 50)])
@pytest.mark.parametrize('shift', [False, True])
def test_swin_polarity_block_in_runs_matches_whole_map(monkeypatch, hw,
                                                       shift):
    """A Pola-Swin polarity block (fused ``qkvg``) streamed in runs of rows
    at CPU inference equals the one-shot global computation."""
    torch.manual_seed(0)
    block = PolaSwinBlock(16, 2, (7, 7), shift=shift, attn_type='L').eval()
    randomise_attention(block)
    x = torch.randn(2, hw[0] * hw[1], 16)
    with torch.no_grad():
        _run_sizes(monkeypatch, small=False)
        whole = block(x, hw)
        monkeypatch.setattr(dispatch, 'ATTN_RUN_ELEMENTS', 16 * hw[1] * 3)
        calls = count_calls(monkeypatch, PolarityAttention, 'forward_in_runs')
        runs = block(x, hw)
    assert len(calls) == 1
    torch.testing.assert_close(runs, whole, rtol=1e-5, atol=1e-5)


def test_training_and_gradients_keep_the_whole_map(monkeypatch):
    """Runs are an inference path: with autograd recording (training or
    eval with gradients) the block attends to the whole map in one go."""
    def small_runs():
        monkeypatch.setattr(dispatch, 'ATTN_RUN_ELEMENTS', 16 * 20)
        monkeypatch.setattr(dispatch, 'FFN_RUN_ELEMENTS', 64)
        monkeypatch.setattr(dispatch, 'FFN_MIN_TOKENS', 7)

    small_runs()
    block = PolaSwinBlock(16, 2, (7, 7), shift=True, attn_type='L')
    hw = (20, 20)
    x = torch.randn(1, 400, 16)
    for train in (True, False):
        block.train(train)
        calls = count_calls(monkeypatch, PolarityAttention, 'forward_in_runs')
        mlp_calls = count_calls(monkeypatch, block.mlp, 'forward')
        block(x, hw).sum().backward()
        assert not calls and len(mlp_calls) == 1
        monkeypatch.undo()
        small_runs()
    # a frozen block under autograd (no parameter, no input needing grad)
    # takes the run paths
    block.eval().requires_grad_(False)
    calls = count_calls(monkeypatch, PolarityAttention, 'forward_in_runs')
    mlp_calls = count_calls(monkeypatch, Mlp, 'forward_into')
    block(x, hw)
    assert len(calls) == 1 and len(mlp_calls) > 1


@pytest.mark.parametrize('cls,arch', [(PolaSwinTransformer, SWIN_TINY_DEPTH2),
                                      (PolaPVT, PVT_TINY)],
                         ids=['swin', 'pvt'])
def test_backbone_inference_paths_match(monkeypatch, cls, arch):
    """Whole backbones, several sizes and batches: the inference paths
    (attention in runs of rows, token runs, in-place patch-embedding norms, the
    channels-last hand-off between PVT stages) give the outputs of the
    plain autograd computation, as NCHW-contiguous maps, and leave the input
    untouched."""
    torch.manual_seed(0)
    model = cls(arch=arch).eval()
    randomise_attention(model)
    for batch, size in [(1, (224, 224)), (2, (250, 333)), (1, (97, 161))]:
        x = torch.randn(batch, 3, *size)
        x_saved = x.clone()
        _run_sizes(monkeypatch, small=False)
        with torch.enable_grad():  # a gradient wanted: no inference path
            whole = [t.detach() for t in model(x.clone().requires_grad_())]
        with torch.no_grad():
            _run_sizes(monkeypatch, small=True)
            mlp_calls = count_calls(monkeypatch, Mlp, 'forward_into')
            run_calls = count_calls(monkeypatch, PolarityAttention,
                                    'forward_in_runs')
            parts = model(x)
        assert len(mlp_calls) > 2 * sum(arch['depths'])
        # the polarity stages more than a run tall
        assert len(run_calls) >= 2
        assert torch.equal(x, x_saved)
        for a, b in zip(parts, whole):
            assert a.is_contiguous()
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('size', [(32, 48), (30, 45)])
def test_patch_embed_norm_in_place_at_inference(monkeypatch, size):
    """At CPU inference the patch embedding normalises its channels-last
    conv output in place, in runs: same tokens as the autograd path, and
    the caller's input is left as it was."""
    monkeypatch.setattr(dispatch, 'NORM_RUN_ELEMENTS', 100)
    torch.manual_seed(0)
    pe = embed.PatchEmbed(3, 16, 4).eval()
    with torch.no_grad():
        pe.norm.weight.normal_()
        pe.norm.bias.normal_()
    x = torch.randn(2, 3, *size)
    x_saved = x.clone()
    norm_calls = count_calls(monkeypatch, pe.norm, 'forward')
    ref, ref_hw = pe(x.clone().requires_grad_())
    assert len(norm_calls) == 1
    with torch.no_grad():
        out, hw = pe(x)
    assert hw == ref_hw
    assert len(norm_calls) > 2  # in runs
    assert out.is_contiguous() and out.shape == ref.shape
    assert torch.equal(x, x_saved)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('act', ['GELU', 'ReLU'])
def test_mlp_into_matches_forward(act):
    torch.manual_seed(0)
    mlp = Mlp(8, 24, act_cfg=dict(type=act)).eval()
    x = torch.randn(10, 8)
    out = torch.empty(10, 8)
    hidden = torch.full((16, 24), float('nan'))  # larger than needed
    with torch.no_grad():
        mlp.forward_into(x, out, hidden)
        torch.testing.assert_close(out, mlp(x))


@pytest.mark.parametrize('hw,rows', [((9, 13), 2), ((9, 13), 4), ((5, 7), 1),
                                     ((12, 6), 5)])
@pytest.mark.parametrize('residual', [False, True])
@pytest.mark.parametrize('fused', [False, True])
def test_polarity_attention_in_runs_matches_forward(hw, rows, residual,
                                                    fused):
    """Global polarity attention streamed in runs of rows (keys, then
    queries, conv with a halo) equals the one-shot forward, also with the
    block's norm and residual folded in, for PVT's ``qg``/``kv`` and Swin's
    fused ``qkvg`` projections."""
    torch.manual_seed(0)
    attn = PolarityAttention(16, 2, (7, 7), fused_qkvg=fused).eval()
    with torch.no_grad():
        for t in (attn.scale, attn.power, attn.positional_encoding,
                  attn.dwc.weight):
            t.normal_(0, 0.5)
    norm = torch.nn.LayerNorm(16) if residual else None
    x = torch.randn(2, hw[0] * hw[1], 16)
    with torch.no_grad():
        ref = attn(norm(x) if norm is not None else x, hw)
        if residual:
            ref = x + ref
        out = attn.forward_in_runs(x, hw, rows, norm=norm,
                                   residual=residual)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('chunk', [1 << 18, 512])
def test_key_state_and_query_apply_split_the_kernel(monkeypatch, chunk):
    """Keys summed over runs, then queries in runs, give the kernel's
    output (with the kernel's walk over pieces of the batch, too)."""
    monkeypatch.setattr(dispatch, 'KERNEL_RUN_ELEMENTS', chunk)
    torch.manual_seed(0)
    B, h, N, d = 2, 3, 300, 8
    q, k, v = (torch.randn(B, h, N, d) for _ in range(3))
    scale, power = torch.randn(1, h, 1, d), torch.randn(1, h, 1, d)
    bias = torch.randn(1, h, N, d)
    ref = polarity_attention_kernel(q, k, v, scale, power, 3.0, k_bias=bias)
    cuts = [0, 37, 150, 151, N]
    state = sum(polarity_key_state(k[:, :, a:b], v[:, :, a:b], scale, power,
                                   3.0, bias[:, :, a:b])
                for a, b in zip(cuts, cuts[1:]))
    out = torch.cat([
        polarity_query_apply(q[:, :, a:b], state, float(N), scale, power, 3.0)
        for a, b in zip(cuts, cuts[1:])], dim=2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_pvt_block_runs_only_at_inference(monkeypatch):
    monkeypatch.setattr(dispatch, 'ATTN_RUN_ELEMENTS', 20 * 16)
    torch.manual_seed(0)
    block = PolaPVTBlock(16, 2, (7, 7), mlp_ratio=2)
    hw = (9, 11)
    x = torch.randn(2, 99, 16)
    calls = count_calls(monkeypatch, PolarityAttention, 'forward_in_runs')
    block.train()(x, hw).sum().backward()
    assert not calls
    block.eval()
    with torch.no_grad():
        out = block(x, hw)
        assert len(calls) == 1
        monkeypatch.setattr(dispatch, 'ATTN_RUN_ELEMENTS', 1 << 30)
        ref = block(x, hw)
    assert len(calls) == 1
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('cls,arch', [(PolaSwinTransformer, SWIN_TINY_DEPTH2),
                                      (PolaPVT, PVT_TINY)],
                         ids=['swin', 'pvt'])
def test_inference_paths_under_bf16_autocast(monkeypatch, cls, arch):
    """Under CPU autocast the token runs fall back to the modules' own
    (autocast) forward per run and give the whole-map results."""
    torch.manual_seed(0)
    model = cls(arch=arch).eval()
    x = torch.randn(1, 3, 250, 333)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        _run_sizes(monkeypatch, small=False)
        whole = model(x)
        _run_sizes(monkeypatch, small=True)
        parts = model(x)
    for a, b in zip(parts, whole):
        assert a.dtype == b.dtype
        # bf16 rounding differs with the grouping of the operations
        err = (a.float() - b.float()).abs().max()
        assert err <= 0.02 * b.float().abs().max()


def test_tracing_takes_no_inference_path(monkeypatch):
    """torch.jit.trace (ONNX export) records the plain computation: the
    runs, groups and in-place norms would fix the graph to the traced
    size."""
    _run_sizes(monkeypatch, small=True)
    torch.manual_seed(0)
    model = PolaPVT(arch=PVT_TINY).eval()
    run_calls = count_calls(monkeypatch, PolarityAttention, 'forward_in_runs')
    mlp_calls = count_calls(monkeypatch, Mlp, 'forward_into')
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        traced = torch.jit.trace(model, x, check_trace=False)
        assert not run_calls and not mlp_calls
        for a, b in zip(traced(x), model(x)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
