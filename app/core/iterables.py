"""What the login-node commands need of Python 3.10 and later, written for Python 3.9.

A login node's system Python (Roihu's is 3.9) runs `app submit`, `app study ... --cluster` and the reports.

Hand-written rather than taken from more_itertools: two small functions do not justify a dependency on every
login node.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import zip_longest

_MISSING = object()


def zip_equal(*iterables: Iterable) -> Iterator[tuple]:
    """``zip(*iterables, strict=True)``: the same tuples, and ValueError when the lengths differ."""
    for items in zip_longest(*iterables, fillvalue=_MISSING):
        if any(item is _MISSING for item in items):
            raise ValueError("zip_equal: the iterables have different lengths")
        yield items


def pairwise(values: Iterable) -> Iterator[tuple]:
    """``itertools.pairwise``: (a, b), (b, c), ... of ``values``."""
    values = list(values)
    return zip(values, values[1:])  # noqa: B905 (one shorter by design; strict= is Python 3.10+)
