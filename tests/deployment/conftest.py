"""Fixtures of the deployment tests: real photos and shapes images."""
import glob

import pytest


@pytest.fixture(scope='module')
def photo(tmp_path_factory) -> str:
    """skimage's astronaut (512x512), as a file."""
    import mmcv
    import skimage.data
    path = str(tmp_path_factory.mktemp('img') / 'astronaut.png')
    mmcv.imwrite(skimage.data.astronaut()[..., ::-1].copy(), path)
    return path


@pytest.fixture(scope='module')
def photos(photo) -> list:
    """Two real photos: skimage's astronaut (square) and matplotlib's
    sample photo of Grace Hopper (600x512, the file as installed)."""
    import matplotlib.cbook
    hopper = matplotlib.cbook.get_sample_data('grace_hopper.jpg',
                                              asfileobj=False)
    return [photo, str(hopper)]


@pytest.fixture(scope='module')
def shapes_images(tmp_path_factory) -> list:
    """Four 128x128 validation images of pola_mm's shapes set (seed 0)."""
    from pola_mm.demo.shapes import make_shapes_dataset
    out = tmp_path_factory.mktemp('shapes')
    make_shapes_dataset(str(out), num_train=1, num_val=4, img_size=128,
                        seed=0)
    return sorted(glob.glob(str(out / 'val' / '*')))
