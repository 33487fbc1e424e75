"""The kernels address tensors past 2^31 elements (int64 offsets): an image
of a batch whose maps start beyond 2^31 elements (Swin-T's qkvg at batch
>= 84 at 800x1344) is read where it lies.

The views are strides alone: a sparse file mapped into memory holds 2^31
float16 elements (4 GB of address space, a few pages of disk and memory).
The images' stride fits an int32 (Triton passes it as one), but the third
image lies past the 2^31st element: under Triton's interpreter (the
conftest), as on a GPU, ``b * stride`` computed in int32 would wrap
there."""
import pytest
import torch

from pola_mm.ops import pacs_attention_pytorch, polarity_attention_naive
from pola_mm.ops.pacs import triton as pacs_kernels
from pola_mm.ops.polarity import triton as polarity_kernels

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.skipif(not polarity_kernels.HAVE_TRITON,
                       reason='Triton is not installed')]

STRIDE = 2**30 + 2048  # images' stride: an int32, as a GPU passes it
FAR = 2 * STRIDE  # the third image's offset, past 2^31 elements


@pytest.fixture(scope='module')
def far_storage(tmp_path_factory):
    """A float16 tensor of ``FAR + 8192`` elements backed by a sparse
    file."""
    path = tmp_path_factory.mktemp('sparse') / 'maps.bin'
    numel = FAR + 8192
    with open(path, 'wb') as f:
        f.truncate(numel * 2)
    return torch.from_file(str(path), shared=True, size=numel,
                           dtype=torch.float16)


def _far_maps(storage, d: int, N: int = 40, h: int = 2, count: int = 3):
    """``count`` ``(3, h, N, d)`` maps whose third image starts past 2^31
    elements, filled with random values, and contiguous copies."""
    g = torch.Generator().manual_seed(0)
    maps = []
    for i in range(count):
        view = storage.as_strided((3, h, N, d), (STRIDE, N * d, d, 1),
                                  storage_offset=i * h * N * d)
        view.copy_(torch.randn(3, h, N, d, generator=g).half())
        maps.append(view)
    assert maps[0][2].storage_offset() > 2**31 > STRIDE
    return maps, [m.float().contiguous() for m in maps]


def test_polarity_kernels_read_past_two_to_the_31(far_storage):
    (q, k, v), (q0, k0, v0) = _far_maps(far_storage, 32)
    g = torch.Generator().manual_seed(1)
    scale = torch.randn(1, 2, 1, 32, generator=g) * 0.3
    power = torch.randn(1, 2, 1, 32, generator=g)
    got = polarity_kernels.polarity_attention_triton(q, k, v, scale, power,
                                                     4.0)
    want = polarity_attention_naive(q0.double(), k0.double(), v0.double(),
                                    scale.double(), power.double(), 4.0)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.double(), want, rtol=0,
                               atol=2e-3 * want.abs().max().item())
    # the backward reads the same maps
    s = scale.clone().requires_grad_()
    out = polarity_kernels.polarity_attention_triton(q, k, v, s, power, 4.0)
    out.float().square().sum().backward()
    ref = s.detach().double().requires_grad_()
    polarity_attention_naive(q0.double(), k0.double(), v0.double(), ref,
                             power.double(), 4.0).square().sum().backward()
    torch.testing.assert_close(s.grad.double(), ref.grad, rtol=2e-2,
                               atol=2e-2 * ref.grad.abs().max().item())


def test_pacs_kernels_read_past_two_to_the_31(far_storage):
    (q, k, v), (q0, k0, v0) = _far_maps(far_storage, 32)
    g = torch.Generator().manual_seed(2)
    s1 = torch.randn(1, 2, 1, 64, generator=g)
    s2 = torch.randn(1, 2, 1, 64, generator=g)
    got = pacs_kernels.pacs_attention_triton(q, k, v, s1, s2)
    want = pacs_attention_pytorch(q0.double(), k0.double(), v0.double(),
                                  s1.double(), s2.double())
    torch.testing.assert_close(got.double(), want, rtol=0,
                               atol=2e-3 * want.abs().max().item())
