"""Write the synthetic COCO-format shapes dataset used by the demo and tests.

Example::

    python tools/misc/make_shapes_dataset.py --out data/shapes
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..', '..'))
from pola_mm.cli import quiet_tool_warnings  # noqa: E402
from pola_mm.demo.shapes import make_shapes_dataset  # noqa: E402

quiet_tool_warnings()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Generate a COCO-format dataset of coloured shapes '
        '(circle, square, triangle) with exact boxes and masks.')
    parser.add_argument('--out', required=True, help='output directory')
    parser.add_argument('--num-train', type=int, default=600)
    parser.add_argument('--num-val', type=int, default=100)
    parser.add_argument('--img-size', type=int, default=128)
    parser.add_argument('--seed', type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    files = make_shapes_dataset(
        args.out,
        num_train=args.num_train,
        num_val=args.num_val,
        img_size=args.img_size,
        seed=args.seed)
    for split, ann_file in files.items():
        print(f'{split}: {ann_file}')


if __name__ == '__main__':
    main()
