"""A tiny raw ILSVRC-style tree (real JPEG files) for converter and pipeline tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def make_tree(
    root: Path, classes: int = 3, per_class: int = 6, val: int = 6, png_as_jpeg: bool = True
) -> Path:
    from app.core.compat import import_tensorflow

    tf = import_tensorflow()
    rng = np.random.default_rng(0)

    def image(h, w):
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 255 // (h + w)], -1)
        return np.clip(base + rng.integers(-20, 20, base.shape), 0, 255).astype(np.uint8)

    wnids = [f"n{1000 + i:08d}" for i in range(classes)]
    for w in wnids:
        (root / "train" / w).mkdir(parents=True)
        for j in range(per_class):
            data = tf.io.encode_jpeg(image(40 + 3 * j, 50 + 2 * j), quality=90).numpy()
            (root / "train" / w / f"{w}_{j}.JPEG").write_bytes(data)
    if png_as_jpeg:  # ImageNet hides a PNG among its JPEGs; the converter must re-encode it
        (root / "train" / wnids[0] / f"{wnids[0]}_png.JPEG").write_bytes(
            tf.io.encode_png(image(33, 44)).numpy()
        )
    (root / "val").mkdir()
    labels = []
    for j in range(val):
        name = f"ILSVRC2012_val_{j + 1:08d}.JPEG"
        (root / "val" / name).write_bytes(tf.io.encode_jpeg(image(48, 48), quality=90).numpy())
        labels.append(wnids[j % classes])
    (root / "val_labels.txt").write_text("\n".join(labels) + "\n")
    return root
