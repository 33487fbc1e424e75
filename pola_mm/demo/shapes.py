"""A synthetic COCO-format instance segmentation dataset of coloured shapes.

Images show a few filled shapes (circle, square, triangle) in random colours
on a plain, slightly noisy background. Shapes never touch each other, so each
instance mask is exactly the set of pixels painted for that shape; boxes are
tight around the mask pixels and masks are stored as uncompressed COCO RLE
(``{'size': [h, w], 'counts': [...]}``, column-major, ``iscrowd=0``), which
pycocotools and mmdet's ``LoadAnnotations`` read directly.

Everything is a pure function of the seed (numpy ``default_rng`` + PIL), so
the same arguments always give byte-identical images and json files. This
module needs only numpy and PIL: it is used by
``tools/misc/make_shapes_dataset.py``, the embedded demo and the tests.
"""
import json
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image, ImageDraw

#: COCO ``categories`` of the dataset; ids start at 1 as in COCO.
SHAPES_CATEGORIES: List[Dict] = [
    dict(id=1, name='circle', supercategory='shape'),
    dict(id=2, name='square', supercategory='shape'),
    dict(id=3, name='triangle', supercategory='shape'),
]

#: Class names in category-id order (``metainfo['classes']`` of a config).
SHAPES_CLASSES: Tuple[str, ...] = tuple(c['name'] for c in SHAPES_CATEGORIES)


def mask_to_rle(mask: np.ndarray) -> Dict:
    """Encode a binary mask as uncompressed COCO run-length encoding.

    Args:
        mask (np.ndarray): Boolean or 0/1 array of shape (H, W).

    Returns:
        dict: ``{'size': [H, W], 'counts': [int, ...]}``; runs alternate
        background / foreground over the pixels in column-major (Fortran)
        order and always start with a (possibly empty) background run, the
        layout of ``pycocotools.mask.frPyObjects``.
    """
    h, w = mask.shape
    flat = np.asarray(mask, dtype=bool).flatten(order='F')
    # Positions where the value changes, plus both ends.
    change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    bounds = np.concatenate(([0], change, [flat.size]))
    counts = np.diff(bounds).tolist()
    if flat.size and flat[0]:
        counts = [0] + counts
    return dict(size=[int(h), int(w)], counts=[int(c) for c in counts])


def mask_to_bbox(mask: np.ndarray) -> List[float]:
    """Tight COCO box ``[x, y, w, h]`` around the foreground pixels.

    A box covers whole pixels: ``x`` is the first foreground column and
    ``w`` the number of columns spanned (so ``x + w`` is one past the last
    column), the convention mmdet uses when it converts to ``x1y1x2y2``.

    Args:
        mask (np.ndarray): Boolean array of shape (H, W) with at least one
            foreground pixel.

    Returns:
        list[float]: ``[x, y, w, h]``.
    """
    ys, xs = np.nonzero(mask)
    if xs.size == 0:
        raise ValueError('mask has no foreground pixels')
    x0, x1 = int(xs.min()), int(xs.max())
    y0, y1 = int(ys.min()), int(ys.max())
    return [float(x0), float(y0), float(x1 - x0 + 1), float(y1 - y0 + 1)]


def _shape_vertices(kind: str, cx: float, cy: float, size: float,
                    angle: float) -> List[Tuple[float, float]]:
    """Vertices of a square or an equilateral triangle of extent ``size``."""
    if kind == 'square':
        radius = size / np.sqrt(2.0)
        angles = angle + np.pi / 4 + np.arange(4) * np.pi / 2
    else:  # triangle: circumradius chosen so the height is about ``size``
        radius = size / 1.5
        angles = angle - np.pi / 2 + np.arange(3) * 2 * np.pi / 3
    return [(float(cx + radius * np.cos(a)), float(cy + radius * np.sin(a)))
            for a in angles]


def _render_shape_mask(kind: str, img_size: int, cx: float, cy: float,
                       size: float, angle: float) -> np.ndarray:
    """Rasterise one shape into a boolean (img_size, img_size) mask."""
    canvas = Image.new('L', (img_size, img_size), 0)
    draw = ImageDraw.Draw(canvas)
    if kind == 'circle':
        r = size / 2
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=1)
    else:
        draw.polygon(_shape_vertices(kind, cx, cy, size, angle), fill=1)
    return np.asarray(canvas, dtype=bool)


def _hsv_to_rgb(h: float, s: float, v: float) -> np.ndarray:
    """One HSV colour (each in [0, 1]) to an RGB float array in [0, 255]."""
    i = int(h * 6) % 6
    f = h * 6 - int(h * 6)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    rgb = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v),
           (v, p, q)][i]
    return np.array(rgb, dtype=np.float64) * 255


def generate_shapes_image(
    rng: np.random.Generator,
    img_size: int = 128,
    num_shapes: Tuple[int, int] = (1, 4),
    size_range: Tuple[float, float] = (0.15, 0.4),
    noise_std: float = 6.0,
    margin: int = 2,
    max_tries: int = 50,
) -> Tuple[np.ndarray, List[Dict]]:
    """Draw one image of non-touching coloured shapes.

    Args:
        rng (np.random.Generator): Source of randomness (advanced in place).
        img_size (int): Side of the square image in pixels.
        num_shapes (tuple[int, int]): Inclusive range of shapes per image.
        size_range (tuple[float, float]): Shape extent as a fraction of
            ``img_size``.
        noise_std (float): Std of the Gaussian pixel noise added everywhere.
        margin (int): Minimum gap in pixels between the boxes of two shapes.
        max_tries (int): Placement attempts per shape before giving up on it.

    Returns:
        tuple: ``(image, instances)``; ``image`` is a uint8 array of shape
        (img_size, img_size, 3) in RGB order, and each instance is a dict
        with ``category_id`` (int, see :data:`SHAPES_CATEGORIES`) and
        ``mask`` (bool array of shape (img_size, img_size)). At least one
        instance is always present.
    """
    bg = _hsv_to_rgb(rng.uniform(), rng.uniform(0, 0.3),
                     rng.uniform(0.05, 0.4))
    image = np.broadcast_to(bg, (img_size, img_size, 3)).copy()
    occupied = np.zeros((img_size, img_size), dtype=bool)
    instances: List[Dict] = []
    target = int(rng.integers(num_shapes[0], num_shapes[1] + 1))
    for _ in range(target):
        for _ in range(max_tries):
            cat = int(rng.integers(len(SHAPES_CATEGORIES)))
            kind = SHAPES_CATEGORIES[cat]['name']
            size = rng.uniform(*size_range) * img_size
            half = size / 2 + 1
            cx = rng.uniform(half, img_size - half)
            cy = rng.uniform(half, img_size - half)
            angle = rng.uniform(0, 2 * np.pi)
            mask = _render_shape_mask(kind, img_size, cx, cy, size, angle)
            if mask.sum() < 16:
                continue
            x, y, w, h = (int(v) for v in mask_to_bbox(mask))
            y0, x0 = max(y - margin, 0), max(x - margin, 0)
            if occupied[y0:y + h + margin, x0:x + w + margin].any():
                continue
            occupied[y:y + h, x:x + w] = True
            colour = _hsv_to_rgb(rng.uniform(), rng.uniform(0.6, 1.0),
                                 rng.uniform(0.7, 1.0))
            image[mask] = colour
            instances.append(dict(category_id=cat + 1, mask=mask))
            break
    if not instances:  # practically unreachable; keep every image labelled
        return generate_shapes_image(rng, img_size, num_shapes, size_range,
                                     noise_std, margin, max_tries)
    image += rng.normal(0, noise_std, image.shape)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8), instances


def make_shapes_split(out_dir: str,
                      split: str,
                      num_images: int,
                      img_size: int = 128,
                      seed: int = 0,
                      **kwargs) -> str:
    """Write one split: ``out_dir/<split>/*.png`` and its COCO json.

    Args:
        out_dir (str): Dataset root.
        split (str): Split name, e.g. ``'train'`` or ``'val'``.
        num_images (int): Number of images to draw.
        img_size (int): Side of the square images in pixels.
        seed (int): Seed of this split's random stream.
        **kwargs: Passed to :func:`generate_shapes_image`.

    Returns:
        str: Path of ``out_dir/annotations/instances_<split>.json``.
    """
    rng = np.random.default_rng(seed)
    img_dir = osp.join(out_dir, split)
    ann_dir = osp.join(out_dir, 'annotations')
    os.makedirs(img_dir, exist_ok=True)
    os.makedirs(ann_dir, exist_ok=True)
    images, annotations = [], []
    for img_id in range(1, num_images + 1):
        image, instances = generate_shapes_image(rng, img_size, **kwargs)
        file_name = f'{img_id:06d}.png'
        Image.fromarray(image).save(osp.join(img_dir, file_name))
        images.append(
            dict(id=img_id, file_name=file_name, width=img_size,
                 height=img_size))
        for inst in instances:
            annotations.append(
                dict(
                    id=len(annotations) + 1,
                    image_id=img_id,
                    category_id=inst['category_id'],
                    bbox=mask_to_bbox(inst['mask']),
                    area=float(inst['mask'].sum()),
                    segmentation=mask_to_rle(inst['mask']),
                    iscrowd=0))
    coco = dict(
        info=dict(description=f'pola_mm synthetic shapes ({split})',
                  version='1.0'),
        licenses=[],
        images=images,
        annotations=annotations,
        categories=SHAPES_CATEGORIES)
    ann_file = osp.join(ann_dir, f'instances_{split}.json')
    with open(ann_file, 'w') as f:
        json.dump(coco, f)
    return ann_file


def make_shapes_dataset(out_dir: str,
                        num_train: int = 600,
                        num_val: int = 100,
                        img_size: int = 128,
                        seed: int = 0,
                        splits: Optional[Sequence[str]] = None,
                        **kwargs) -> Dict[str, str]:
    """Write the train and val splits of the shapes dataset.

    Layout::

        out_dir/train/000001.png ...
        out_dir/val/000001.png ...
        out_dir/annotations/instances_train.json
        out_dir/annotations/instances_val.json

    The two splits draw from independent streams derived from ``seed``, so
    changing ``num_train`` does not change the validation images.

    Args:
        out_dir (str): Dataset root (created if needed).
        num_train (int): Number of training images.
        num_val (int): Number of validation images.
        img_size (int): Side of the square images in pixels.
        seed (int): Seed; equal arguments give byte-identical files.
        splits (Sequence[str], optional): Subset of ``('train', 'val')`` to
            write. Defaults to both.
        **kwargs: Passed to :func:`generate_shapes_image`.

    Returns:
        dict[str, str]: Split name -> annotation file path.
    """
    counts = dict(train=num_train, val=num_val)
    splits = tuple(splits) if splits is not None else ('train', 'val')
    seeds = np.random.SeedSequence(seed).spawn(2)
    split_seeds = dict(
        train=int(seeds[0].generate_state(1)[0]),
        val=int(seeds[1].generate_state(1)[0]))
    return {
        split: make_shapes_split(out_dir, split, counts[split], img_size,
                                 split_seeds[split], **kwargs)
        for split in splits
    }
