"""A real TFDS data dir with Fashion-MNIST, prepared here from Debian's `dataset-fashion-mnist` files.

TFDS's own FashionMNIST builder writes it (the same files, features and metadata as `tfds.load` after a
download); only its download step is replaced by the local IDX files, since these machines have no network.
So the tests need nothing beside the repository: `.ci/run` and `make test` install the Debian package.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

DEBIAN_FILES = Path("/usr/share/datasets/fashion-mnist")
NAMES = {
    "train_data": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_data": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}


class _LocalFiles:
    """Stands in for TFDS's DownloadManager in FashionMNIST._split_generators, its only use of it."""

    def __init__(self, files: dict[str, str]):
        self.files = files

    def download_and_extract(self, urls: dict) -> dict:
        return {key: self.files[key] for key in urls}


def prepare(data_dir: Path, source: Path = DEBIAN_FILES) -> Path:
    """Prepare ``fashion_mnist`` in the TFDS data dir ``data_dir`` from the gzipped IDX files in ``source``."""
    import tensorflow_datasets as tfds

    extracted = data_dir / "extracted"
    extracted.mkdir(parents=True, exist_ok=True)
    files = {}
    for key, name in NAMES.items():
        out = extracted / name.removesuffix(".gz")
        with gzip.open(source / name, "rb") as f, open(out, "wb") as g:
            shutil.copyfileobj(f, g)
        files[key] = str(out)
    builder = tfds.builder("fashion_mnist", data_dir=str(data_dir))
    generators = builder._split_generators
    builder._split_generators = lambda dl_manager: generators(_LocalFiles(files))
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    shutil.rmtree(extracted)
    return data_dir
