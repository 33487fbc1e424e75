"""Synthetic datasets of coloured shapes: the demo's and the tests'.

One generator draws every synthetic image of the package and its tests.
An image holds a few filled shapes that never touch each other, so each
instance mask is exactly the set of pixels painted for that shape; boxes are
tight around the mask pixels. Two scene styles:

* ``'shapes'`` (the default; the embedded demo): circles, squares and
  triangles, rotated, in random colours on a plain, slightly noisy
  background; the class is the shape (:data:`SHAPES_CLASSES`).
* ``'boxes'`` (the end-to-end tests): axis-aligned rectangles and ellipses
  whose class is coded by a fixed colour (:data:`BOX_COLOURS`) on a grey
  noise background; a few iterations of a tiny model learn it.

The writers share the drawing, the boxes and the masks:

* :func:`make_shapes_dataset` / :func:`make_shapes_split` /
  :func:`write_coco` -- COCO instance sets (png images and a json with
  boxes and uncompressed RLE or polygon masks, which pycocotools and
  mmdet's ``LoadAnnotations`` read directly);
* :func:`make_shapes_ade` -- ADE20K-style semantic sets (jpg images and png
  label maps); :func:`make_shapes_ade_dataset` -- the shapes dataset's
  images in that format;
* :func:`make_colour_folder` -- an ImageNet-style classification folder
  whose classes differ by colour.

Everything is a pure function of the seed (numpy ``default_rng`` + PIL), so
the same arguments always give byte-identical files. This module needs only
numpy and PIL: it is used by ``tools/misc/make_shapes_dataset.py``, the
embedded demo and the tests (``tests/e2e_data.py``).
"""
import json
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image, ImageDraw

#: COCO ``categories`` of the ``'shapes'`` style; ids start at 1 as in COCO.
SHAPES_CATEGORIES: List[Dict] = [
    dict(id=1, name='circle', supercategory='shape'),
    dict(id=2, name='square', supercategory='shape'),
    dict(id=3, name='triangle', supercategory='shape'),
]

#: Class names in category-id order (``metainfo['classes']`` of a config).
SHAPES_CLASSES: Tuple[str, ...] = tuple(c['name'] for c in SHAPES_CATEGORIES)

#: Classes of :func:`make_shapes_ade_dataset`'s label maps after mmseg's
#: ``reduce_zero_label`` (the shapes, then the background).
SHAPES_SEG_CLASSES: Tuple[str, ...] = SHAPES_CLASSES + ('background', )

#: ADE20K split folder of each split of the shapes dataset.
ADE_SPLITS: Dict[str, str] = dict(train='training', val='validation')

#: The ``'boxes'`` style: colour (RGB), PIL drawing and name of each class.
BOX_COLOURS: Tuple[Tuple[int, int, int], ...] = ((220, 40, 40), (40, 200, 60),
                                                 (50, 80, 230))
BOX_KINDS: Tuple[str, ...] = ('rectangle', 'ellipse', 'rectangle')
BOX_CLASSES: Tuple[str, ...] = ('red_rectangle', 'green_ellipse',
                                'blue_rectangle')

# ------------------------------------------------------ boxes and masks


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


def mask_to_polygon(mask: np.ndarray) -> List[float]:
    """Outline of a convex foreground as one COCO polygon.

    The polygon runs down the left ends of the rows and back up their right
    ends (pixel edges), which is exact enough for the convex shapes drawn
    here.

    Args:
        mask (np.ndarray): Boolean array of shape (H, W) with at least one
            foreground pixel.

    Returns:
        list[float]: ``[x0, y0, x1, y1, ...]``.
    """
    ys, xs = np.nonzero(mask)
    left, right = [], []
    for y in range(int(ys.min()), int(ys.max()) + 1):
        row = xs[ys == y]
        left.append((float(row.min()), float(y)))
        right.append((float(row.max()) + 1, float(y)))
    bottom = int(ys.max()) + 1
    left.append((left[-1][0], float(bottom)))
    right.append((right[-1][0], float(bottom)))
    pts = left + right[::-1]
    return [c for p in pts for c in p]


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


# ------------------------------------------------------------- drawing


def _rasterise(img_size: int, kind: str, xy: Sequence) -> np.ndarray:
    """Boolean (img_size, img_size) mask of one PIL ``kind`` (``'ellipse'``
    or ``'rectangle'`` in a box, ``'polygon'`` through vertices)."""
    canvas = Image.new('L', (img_size, img_size), 0)
    getattr(ImageDraw.Draw(canvas), kind)(xy, fill=1)
    return np.asarray(canvas, dtype=bool)


def _place(occupied: np.ndarray, x0: int, y0: int, x1: int, y1: int,
           margin: int) -> bool:
    """Claim the box ``[x0, x1) x [y0, y1)`` in ``occupied`` if at least
    ``margin`` free pixels separate it from every box claimed before."""
    if occupied[max(y0 - margin, 0):y1 + margin,
                max(x0 - margin, 0):x1 + margin].any():
        return False
    occupied[y0:y1, x0:x1] = True
    return True


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
    """Draw one image of the ``'shapes'`` style.

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
            if kind == 'circle':
                r = size / 2
                mask = _rasterise(img_size, 'ellipse',
                                  [cx - r, cy - r, cx + r, cy + r])
            else:
                mask = _rasterise(img_size, 'polygon',
                                  _shape_vertices(kind, cx, cy, size, angle))
            if mask.sum() < 16:
                continue
            x, y, w, h = (int(v) for v in mask_to_bbox(mask))
            if not _place(occupied, x, y, x + w, y + h, margin):
                continue
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


def generate_boxes_image(
    rng: np.random.Generator,
    img_size: int = 96,
    max_shapes: int = 2,
    noise_range: Tuple[int, int] = (90, 140),
    margin: int = 1,
    max_tries: int = 50,
) -> Tuple[np.ndarray, List[Dict]]:
    """Draw one image of the ``'boxes'`` style.

    Rectangles and ellipses (:data:`BOX_KINDS`) with sides of a quarter to
    half the image, each filled with the fixed colour of its class
    (:data:`BOX_COLOURS`), on uniform grey noise.

    Args:
        rng (np.random.Generator): Source of randomness (advanced in place).
        img_size (int): Side of the square image in pixels.
        max_shapes (int): Most shapes per image.
        noise_range (tuple[int, int]): Half-open range of the background's
            uniform pixel values.
        margin (int): Minimum gap in pixels between the boxes of two shapes.
        max_tries (int): Placement attempts for the whole image.

    Returns:
        tuple: ``(image, instances)`` as :func:`generate_shapes_image`
        returns them (category ids 1 to ``len(BOX_CLASSES)``; an image may
        hold no instance if every attempt collides, which the sizes used
        never do).
    """
    occupied = np.zeros((img_size, img_size), dtype=bool)
    boxes: List[Tuple[int, Tuple[int, int, int, int]]] = []
    for _ in range(max_tries):
        if len(boxes) == max_shapes:
            break
        w, h = rng.integers(img_size // 4, img_size // 2, size=2)
        x0 = int(rng.integers(0, img_size - w))
        y0 = int(rng.integers(0, img_size - h))
        box = (x0, y0, x0 + int(w), y0 + int(h))  # PIL: both ends inside
        if _place(occupied, x0, y0, box[2] + 1, box[3] + 1, margin):
            boxes.append((int(rng.integers(0, len(BOX_COLOURS))), box))
    image = rng.integers(*noise_range, size=(img_size, img_size, 3),
                         dtype=np.uint8)
    instances: List[Dict] = []
    for cls, box in boxes:
        mask = _rasterise(img_size, BOX_KINDS[cls], box)
        image[mask] = BOX_COLOURS[cls]
        instances.append(dict(category_id=cls + 1, mask=mask))
    return image, instances


#: Scene style -> (image generator, its class names).
STYLES = dict(
    shapes=(generate_shapes_image, SHAPES_CLASSES),
    boxes=(generate_boxes_image, BOX_CLASSES),
)


def _generator(style: str):
    if style not in STYLES:
        raise ValueError(f'unknown style {style!r}; one of {sorted(STYLES)}')
    return STYLES[style]


def label_map(instances: Sequence[Dict], img_size: int,
              background: int = 0) -> np.ndarray:
    """Semantic map of an image's instances: ``category_id`` on the pixels
    of each mask, ``background`` elsewhere (uint8, (img_size, img_size))."""
    label = np.zeros((img_size, img_size), dtype=np.uint8)
    for inst in instances:
        label[inst['mask']] = inst['category_id']
    label[label == 0] = background
    return label


# ------------------------------------------------------------- writers


def write_coco(img_dir: str,
               ann_file: str,
               num_images: int,
               img_size: int = 128,
               seed: int = 0,
               style: str = 'shapes',
               classes: Optional[Sequence[str]] = None,
               mask_format: str = 'rle',
               file_name: str = '{id:06d}.png',
               description: str = 'pola_mm synthetic shapes',
               **kwargs) -> str:
    """Draw ``num_images`` images into ``img_dir`` and their COCO json.

    Args:
        img_dir (str): Folder of the png images (created if needed).
        ann_file (str): Path of the json (its folder is created if needed).
        num_images (int): Number of images; their ids run from 1.
        img_size (int): Side of the square images in pixels.
        seed (int): Seed of the random stream.
        style (str): ``'shapes'`` or ``'boxes'`` (see the module).
        classes (Sequence[str], optional): Category names in id order.
            Defaults to the style's.
        mask_format (str): ``'rle'`` (uncompressed RLE) or ``'polygon'``.
        file_name (str): Image file name, formatted with ``id`` (from 1)
            and ``index`` (from 0).
        description (str): ``info['description']`` of the json.
        **kwargs: Passed to the style's image generator.

    Returns:
        str: ``ann_file``.
    """
    generate, default_classes = _generator(style)
    if mask_format not in ('rle', 'polygon'):
        raise ValueError(f'mask_format must be rle or polygon: {mask_format}')
    classes = default_classes if classes is None else classes
    rng = np.random.default_rng(seed)
    os.makedirs(img_dir, exist_ok=True)
    os.makedirs(osp.dirname(osp.abspath(ann_file)), exist_ok=True)
    images, annotations = [], []
    for img_id in range(1, num_images + 1):
        image, instances = generate(rng, img_size, **kwargs)
        name = file_name.format(id=img_id, index=img_id - 1)
        Image.fromarray(image).save(osp.join(img_dir, name))
        images.append(
            dict(id=img_id, file_name=name, width=img_size, height=img_size))
        for inst in instances:
            mask = inst['mask']
            segm = (mask_to_rle(mask) if mask_format == 'rle' else
                    [mask_to_polygon(mask)])
            annotations.append(
                dict(
                    id=len(annotations) + 1,
                    image_id=img_id,
                    category_id=inst['category_id'],
                    bbox=mask_to_bbox(mask),
                    area=float(mask.sum()),
                    segmentation=segm,
                    iscrowd=0))
    coco = dict(
        info=dict(description=description, version='1.0'),
        licenses=[],
        images=images,
        annotations=annotations,
        categories=[
            dict(id=k + 1, name=name, supercategory='shape')
            for k, name in enumerate(classes)
        ])
    with open(ann_file, 'w') as f:
        json.dump(coco, f)
    return ann_file


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
        **kwargs: Passed to :func:`write_coco` (``style``, ``classes``,
            ``mask_format``) and on to the style's image generator.

    Returns:
        str: Path of ``out_dir/annotations/instances_<split>.json``.
    """
    return write_coco(
        osp.join(out_dir, split),
        osp.join(out_dir, 'annotations', f'instances_{split}.json'),
        num_images, img_size, seed,
        description=f'pola_mm synthetic shapes ({split})', **kwargs)


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
        **kwargs: Passed to :func:`make_shapes_split`.

    Returns:
        dict[str, str]: Split name -> annotation file path.
    """
    counts = dict(train=num_train, val=num_val)
    splits = tuple(splits) if splits is not None else ('train', 'val')
    split_seeds = _split_seeds(seed)
    return {
        split: make_shapes_split(out_dir, split, counts[split], img_size,
                                 split_seeds[split], **kwargs)
        for split in splits
    }


def _split_seeds(seed: int) -> Dict[str, int]:
    """Seeds of the independent ``'train'`` and ``'val'`` streams of the
    shapes dataset, derived from ``seed``."""
    seeds = np.random.SeedSequence(seed).spawn(2)
    return dict(
        train=int(seeds[0].generate_state(1)[0]),
        val=int(seeds[1].generate_state(1)[0]))


def make_shapes_ade(out_dir: str,
                    num_images: int = 8,
                    img_size: int = 64,
                    seed: int = 0,
                    style: str = 'shapes',
                    background: Optional[int] = None,
                    splits: Sequence[str] = ('training', 'validation'),
                    **kwargs) -> str:
    """Write an ADE20K-style semantic segmentation set.

    Layout ``out_dir/images/<split>/0000.jpg ...`` (jpeg, quality 95) and
    ``out_dir/annotations/<split>/0000.png ...`` label maps: 0 is ADE20K's
    "other" (ignored with ``reduce_zero_label``), 1 to N the classes of the
    style and ``background`` the rest. Every split holds the same images.

    Args:
        out_dir (str): Dataset root (created if needed).
        num_images (int): Number of images.
        img_size (int): Side of the square images in pixels.
        seed (int): Seed of the random stream.
        style (str): ``'shapes'`` or ``'boxes'`` (see the module).
        background (int, optional): Label of the pixels outside the shapes.
            Defaults to N + 1, a class of its own, so every pixel is
            supervised.
        splits (Sequence[str]): Split folders to write.
        **kwargs: Passed to the style's image generator.

    Returns:
        str: ``out_dir``.
    """
    generate, classes = _generator(style)
    if background is None:
        background = len(classes) + 1
    rng = np.random.default_rng(seed)
    for split in splits:
        os.makedirs(osp.join(out_dir, 'images', split), exist_ok=True)
        os.makedirs(osp.join(out_dir, 'annotations', split), exist_ok=True)
    for i in range(num_images):
        image, instances = generate(rng, img_size, **kwargs)
        img = Image.fromarray(image)
        label = Image.fromarray(label_map(instances, img_size, background))
        for split in splits:
            img.save(osp.join(out_dir, 'images', split, f'{i:04d}.jpg'),
                     quality=95)
            label.save(osp.join(out_dir, 'annotations', split,
                                f'{i:04d}.png'))
    return out_dir


def make_shapes_ade_dataset(out_dir: str,
                            num_train: int = 600,
                            num_val: int = 100,
                            img_size: int = 128,
                            seed: int = 0,
                            **kwargs) -> str:
    """Write the shapes dataset as an ADE20K-style semantic set.

    The pictures are those of :func:`make_shapes_dataset` with the same
    arguments (the same split streams; jpeg here, png there), each with its
    label map. Layout::

        out_dir/images/training/0000.jpg ...     (num_train images)
        out_dir/images/validation/0000.jpg ...   (num_val images)
        out_dir/annotations/training/0000.png ...
        out_dir/annotations/validation/0000.png ...

    Labels, as ADE20K's: 0 unused ("other", ignored by mmseg's
    ``reduce_zero_label``), 1 to 3 the shapes, 4 the background; after
    ``reduce_zero_label`` the classes are :data:`SHAPES_SEG_CLASSES`.

    Args:
        out_dir (str): Dataset root (created if needed).
        num_train (int): Number of training images.
        num_val (int): Number of validation images.
        img_size (int): Side of the square images in pixels.
        seed (int): Seed; equal arguments give byte-identical files.
        **kwargs: Passed to :func:`make_shapes_ade` (with the default
            ``style='shapes'``, the labels above).

    Returns:
        str: ``out_dir``.
    """
    counts = dict(train=num_train, val=num_val)
    split_seeds = _split_seeds(seed)
    for split, folder in ADE_SPLITS.items():
        make_shapes_ade(out_dir, counts[split], img_size, split_seeds[split],
                        splits=(folder, ), **kwargs)
    return out_dir


def make_colour_folder(out_dir: str,
                       per_class: int = 8,
                       img_size: int = 32,
                       seed: int = 0,
                       colours: Sequence[Sequence[int]] = BOX_COLOURS,
                       splits: Sequence[str] = ('train', 'val')) -> str:
    """Write an ImageNet-style folder of classes that differ by colour.

    Layout ``out_dir/<split>/class_<k>/<i>.png``: each image is dark noise
    (0 to 59) plus 0.8 x the class colour.

    Args:
        out_dir (str): Dataset root (created if needed).
        per_class (int): Images per class and split.
        img_size (int): Side of the square images in pixels.
        seed (int): Seed of the random stream.
        colours (Sequence): RGB colour of each class.
        splits (Sequence[str]): Split folders to write.

    Returns:
        str: ``out_dir``.
    """
    rng = np.random.default_rng(seed)
    for split in splits:
        for k, colour in enumerate(colours):
            d = osp.join(out_dir, split, f'class_{k}')
            os.makedirs(d, exist_ok=True)
            for i in range(per_class):
                base = rng.integers(0, 60, size=(img_size, img_size, 3))
                img = np.clip(base + np.array(colour) * 0.8, 0, 255)
                Image.fromarray(img.astype(np.uint8)).save(
                    osp.join(d, f'{i}.png'))
    return out_dir
