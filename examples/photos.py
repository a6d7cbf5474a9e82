"""A small class-per-folder photo dataset to try your model on: DEST/train/<photo>/ and DEST/val/<photo>/,
each image a random crop of one of scikit-image's bundled sample photographs (the class is which photograph).

    python examples/photos.py DEST [--per-class 64] [--val 16] [--seed 0]

Needs scikit-image (`pip install scikit-image`, as `make bench` installs it) and Pillow. Then:
`app data folder-to-tfrecord DEST DEST-tfrecord` (docs/your-model.md).
"""

import argparse
import random
import sys
from pathlib import Path

CLASSES = ("astronaut", "coffee", "chelsea", "rocket")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--per-class", type=int, default=64)
    parser.add_argument("--val", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        from PIL import Image
        from skimage import data
    except ImportError as exc:
        sys.exit(f"Error: {exc.name} is not installed: pip install scikit-image pillow")
    rng = random.Random(args.seed)
    for name in CLASSES:
        photo = Image.fromarray(getattr(data, name)()[..., :3])
        w, h = photo.size
        for split, count in (("train", args.per_class), ("val", args.val)):
            folder = args.dest / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                side = int(min(w, h) * rng.uniform(0.4, 0.9))
                x, y = rng.randint(0, w - side), rng.randint(0, h - side)
                crop = photo.crop((x, y, x + side, y + side)).resize((96, 96), Image.BICUBIC)
                crop.save(folder / f"{name}_{i:04d}.jpg", quality=90)
    print(
        f"{args.dest}: {len(CLASSES)} classes, {args.per_class} training and {args.val} validation images "
        "each"
    )


if __name__ == "__main__":
    main()
