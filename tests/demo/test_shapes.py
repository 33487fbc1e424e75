"""The synthetic shapes dataset: deterministic, exact boxes, valid COCO."""
import hashlib
import json
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO

from pola_mm.demo.shapes import (SHAPES_CLASSES, SHAPES_SEG_CLASSES,
                                 generate_shapes_image,
                                 make_shapes_ade_dataset, make_shapes_dataset,
                                 mask_to_bbox, mask_to_rle)


def rle_to_mask(rle: dict) -> np.ndarray:
    """Decode an uncompressed COCO RLE (the inverse of ``mask_to_rle``).

    Args:
        rle (dict): ``{'size': [H, W], 'counts': [int, ...]}``.

    Returns:
        np.ndarray: Boolean mask of shape (H, W).
    """
    h, w = rle['size']
    values = np.arange(len(rle['counts'])) % 2 == 1
    flat = np.repeat(values, rle['counts'])
    return flat.reshape((w, h)).T.copy()


def _digest(root: str) -> dict:
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            path = osp.join(dirpath, name)
            with open(path, 'rb') as f:
                out[osp.relpath(path, root)] = hashlib.md5(
                    f.read()).hexdigest()
    return out


def test_deterministic_by_seed(tmp_path):
    make_shapes_dataset(str(tmp_path / 'a'), num_train=6, num_val=3, seed=3)
    make_shapes_dataset(str(tmp_path / 'b'), num_train=6, num_val=3, seed=3)
    make_shapes_dataset(str(tmp_path / 'c'), num_train=6, num_val=3, seed=4)
    a, b, c = (_digest(str(tmp_path / k)) for k in 'abc')
    assert len(a) == 6 + 3 + 2
    assert a == b
    assert a['annotations/instances_train.json'] != \
        c['annotations/instances_train.json']


def test_val_independent_of_num_train(tmp_path):
    make_shapes_dataset(str(tmp_path / 'a'), num_train=2, num_val=3)
    make_shapes_dataset(str(tmp_path / 'b'), num_train=5, num_val=3)
    a, b = _digest(str(tmp_path / 'a')), _digest(str(tmp_path / 'b'))
    assert a['annotations/instances_val.json'] == \
        b['annotations/instances_val.json']


def test_rle_round_trip():
    rng = np.random.default_rng(0)
    for shape in [(5, 7), (1, 1), (4, 3)]:
        mask = rng.random(shape) > 0.5
        assert (rle_to_mask(mask_to_rle(mask)) == mask).all()
    full = np.ones((3, 2), dtype=bool)
    assert mask_to_rle(full)['counts'] == [0, 6]
    assert mask_to_rle(~full)['counts'] == [6]


def test_instances_tight_and_disjoint():
    rng = np.random.default_rng(1)
    for _ in range(20):
        image, instances = generate_shapes_image(rng, img_size=64)
        assert image.shape == (64, 64, 3) and image.dtype == np.uint8
        assert len(instances) >= 1
        union = np.zeros((64, 64), dtype=int)
        for inst in instances:
            assert 1 <= inst['category_id'] <= len(SHAPES_CLASSES)
            mask = inst['mask']
            x, y, w, h = (int(v) for v in mask_to_bbox(mask))
            # Tight: every border row/column of the box holds mask pixels.
            crop = mask[y:y + h, x:x + w]
            assert crop.sum() == mask.sum()
            assert crop[0].any() and crop[-1].any()
            assert crop[:, 0].any() and crop[:, -1].any()
            union += mask
        assert union.max() == 1


def test_loads_with_pycocotools(tmp_path):
    coco_api = pytest.importorskip('pycocotools.coco')
    mask_utils = pytest.importorskip('pycocotools.mask')
    files = make_shapes_dataset(str(tmp_path), num_train=4, num_val=2)
    coco = coco_api.COCO(files['train'])
    assert [c['name'] for c in coco.loadCats(coco.getCatIds())] == \
        list(SHAPES_CLASSES)
    assert len(coco.getImgIds()) == 4
    for ann in coco.loadAnns(coco.getAnnIds()):
        assert ann['iscrowd'] == 0
        mask = coco.annToMask(ann).astype(bool)
        assert mask.sum() == ann['area']
        assert mask_to_bbox(mask) == ann['bbox']
        rle = mask_utils.frPyObjects(ann['segmentation'], 128, 128)
        assert list(mask_utils.toBbox(rle)) == ann['bbox']


def test_cli(tmp_path):
    out = tmp_path / 'shapes'
    subprocess.run([
        sys.executable,
        osp.join(REPO, 'tools', 'misc', 'make_shapes_dataset.py'), '--out',
        str(out), '--num-train', '3', '--num-val', '2', '--img-size', '96'
    ], check=True, capture_output=True)
    with open(out / 'annotations' / 'instances_val.json') as f:
        val = json.load(f)
    assert len(val['images']) == 2
    assert val['images'][0]['width'] == 96
    assert len(os.listdir(out / 'train')) == 3
    # and the same images as an ADE20K-format set in out/ade
    for kind, split, count in [('images', 'training', 3),
                               ('annotations', 'validation', 2)]:
        assert len(os.listdir(out / 'ade' / kind / split)) == count


def test_ade_copy_holds_the_coco_images_and_their_masks(tmp_path):
    """``make_shapes_ade_dataset`` draws the pictures of
    ``make_shapes_dataset`` with the same arguments (jpeg there): label 1 to
    3 exactly on each instance's mask, 4 (background) elsewhere; its
    validation images do not depend on the number of training images."""
    from PIL import Image
    files = make_shapes_dataset(str(tmp_path / 'coco'), num_train=3,
                                num_val=2, seed=3)
    make_shapes_ade_dataset(str(tmp_path / 'ade'), num_train=3, num_val=2,
                            seed=3)
    assert SHAPES_SEG_CLASSES == SHAPES_CLASSES + ('background', )
    for split, folder, coco_dir in [('train', 'training', 'train'),
                                    ('val', 'validation', 'val')]:
        with open(files[split]) as f:
            coco = json.load(f)
        assert len(os.listdir(tmp_path / 'ade' / 'images' / folder)) == \
            len(coco['images'])
        for k, info in enumerate(coco['images']):
            png = np.asarray(Image.open(
                tmp_path / 'coco' / coco_dir / info['file_name']), float)
            jpg = np.asarray(Image.open(
                tmp_path / 'ade' / 'images' / folder / f'{k:04d}.jpg'), float)
            # jpeg smooths the pixel noise (about 5); another picture is
            # tens of levels away
            assert np.abs(png - jpg).mean() < 10
            label = np.asarray(Image.open(
                tmp_path / 'ade' / 'annotations' / folder / f'{k:04d}.png'))
            expected = np.full(label.shape, 4, dtype=np.uint8)
            for ann in coco['annotations']:
                if ann['image_id'] == info['id']:
                    expected[rle_to_mask(ann['segmentation'])] = \
                        ann['category_id']
            np.testing.assert_array_equal(label, expected)
    make_shapes_ade_dataset(str(tmp_path / 'ade5'), num_train=5, num_val=2,
                            seed=3)
    for name in ('images/validation/0001.jpg',
                 'annotations/validation/0001.png'):
        assert (tmp_path / 'ade' / name).read_bytes() == \
            (tmp_path / 'ade5' / name).read_bytes()
