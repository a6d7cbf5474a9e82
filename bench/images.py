"""ImageNet-like JPEGs for benchmarks: crops and rescales of real photographs at ImageNet's typical size.

Synthetic noise decodes at a very different speed from photographs, so the benchmark images are made from
scikit-image's bundled sample photos: random crops (30-100% of the area), rescaled to about 400x350 (sizes
300-500 x 250-450), saved as JPEG quality 90, into a raw ILSVRC-style tree (train/<wnid>/, val/ + labels),
which `app data imagenet-to-tfrecord` then converts.
"""

from __future__ import annotations

import random
from pathlib import Path

# Colour photographs bundled in scikit-image's wheel (no download needed).
SAMPLES = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "motorcycle_left",
    "motorcycle_right",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "cat",
    "colorwheel",
    "logo",
)


def photos():
    import numpy as np
    from skimage import data

    out = []
    for name in SAMPLES:
        try:
            image = getattr(data, name)()
        except Exception:  # some samples need a download this machine cannot make: skip them
            continue
        if image.ndim == 3 and image.shape[2] >= 3 and min(image.shape[:2]) >= 256:
            out.append(np.ascontiguousarray(image[..., :3]))
    if len(out) < 3:
        raise SystemExit("bench: fewer than 3 usable sample photographs in scikit-image")
    return out


def make_tree(root: Path, classes: int = 10, per_class: int = 320, val: int = 128, seed: int = 0) -> Path:
    from PIL import Image

    rng = random.Random(seed)
    sources = photos()

    def one():
        photo = Image.fromarray(rng.choice(sources))
        w, h = photo.size
        area = rng.uniform(0.3, 1.0)
        cw, ch = int(w * area**0.5), int(h * area**0.5)
        x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
        size = (rng.randint(300, 500), rng.randint(250, 450))
        return photo.crop((x, y, x + cw, y + ch)).resize(size, Image.BICUBIC)

    wnids = [f"n{10000000 + i:08d}" for i in range(classes)]
    for w in wnids:
        (root / "train" / w).mkdir(parents=True, exist_ok=True)
        for j in range(per_class):
            one().save(root / "train" / w / f"{w}_{j}.JPEG", quality=90)
    (root / "val").mkdir(parents=True, exist_ok=True)
    labels = []
    for j in range(val):
        one().save(root / "val" / f"ILSVRC2012_val_{j + 1:08d}.JPEG", quality=90)
        labels.append(wnids[j % classes])
    (root / "val_labels.txt").write_text("\n".join(labels) + "\n")
    return root
