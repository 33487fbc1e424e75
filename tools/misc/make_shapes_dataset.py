"""Write the synthetic shapes dataset used by the demo and tests.

Two copies of the same images: a COCO-format instance set (mmdet) and an
ADE20K-format semantic set (mmseg) in ``<out>/ade``.

Example::

    python tools/misc/make_shapes_dataset.py --out data/shapes

writes::

    data/shapes/{train,val}/*.png
    data/shapes/annotations/instances_{train,val}.json
    data/shapes/ade/images/{training,validation}/*.jpg
    data/shapes/ade/annotations/{training,validation}/*.png
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..', '..'))
from pola_mm.cli import quiet_tool_warnings  # noqa: E402
from pola_mm.demo import shapes  # noqa: E402

quiet_tool_warnings()

#: the sets this tool writes: COCO (mmdet) in ``--out``, ADE20K (mmseg) in
#: ``--out/<ADE_DIR>``
FORMATS = ('coco', 'ade')
ADE_DIR = 'ade'


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Generate a dataset of coloured shapes (circle, square, '
        'triangle) with exact boxes and masks: a COCO-format instance set '
        'in --out and the same images as an ADE20K-format semantic set in '
        '--out/ade (classes circle, square, triangle, background after '
        "mmseg's reduce_zero_label).")
    parser.add_argument('--out', required=True, help='output directory')
    parser.add_argument('--num-train', type=int, default=600)
    parser.add_argument('--num-val', type=int, default=100)
    parser.add_argument('--img-size', type=int, default=128)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument(
        '--formats', nargs='+', choices=FORMATS, default=list(FORMATS),
        help='which sets to write (default: both)')
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    sizes = dict(num_train=args.num_train, num_val=args.num_val,
                 img_size=args.img_size, seed=args.seed)
    if 'coco' in args.formats:
        files = shapes.make_shapes_dataset(args.out, **sizes)
        for split, ann_file in files.items():
            print(f'{split}: {ann_file}')
    if 'ade' in args.formats:
        root = shapes.make_shapes_ade_dataset(
            osp.join(args.out, ADE_DIR), **sizes)
        print(f'ade20k: {root}')


if __name__ == '__main__':
    main()
