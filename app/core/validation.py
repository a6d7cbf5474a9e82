"""The range checks of a resolved config, each naming the field.

:func:`validate` is run by app.core.config.build; ``run.checkpoint_every`` is converted once, by
:func:`checkpoint_interval`.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable

from app.core import modelref
from app.core.errors import UsageError, brief, show
from app.core.iterables import pairwise
from app.core.schema import (
    ENGINES,
    FP16_ON_TF,
    MIN_IMAGE_SIZE,
    PRECISIONS,
    SAFE,
    SAFE_HINT,
    SCHEDULES,
    SEED_MAX,
    SOURCES,
    WARMUPS,
    Config,
    DataConfig,
    ModelConfig,
)


def _check_model(m: ModelConfig, need: Callable[[bool, str, str], None]) -> None:
    """Check ``model.name`` and ``model.weights``.

    ``model.name`` is checked in any of its forms, parsed only: a model file is looked for where it is used.
    """
    ref = modelref.parse(m.name)
    need(
        not m.weights or ref.kind == "applications",
        "model.weights",
        f"loads a pretrained base into applications.<Name> models, not {brief(m.name)}; a model file loads "
        "its own weights (drop model.weights)",
    )
    need(m.weights.isprintable(), "model.weights", f"{brief(m.weights)} is not a file name")


def _check_image_size(m: ModelConfig, d: DataConfig, need: Callable[[bool, str, str], None]) -> None:
    """The smallest image a built-in ResNet takes (a model of the user's says so itself when it is built)."""
    smallest = MIN_IMAGE_SIZE.get(m.name)
    need(
        smallest is None or d.image_size == 0 or d.image_size >= smallest,
        "data.image_size",
        f"{m.name} needs images of at least {smallest} px, got {d.image_size}; "
        f"use >= {smallest}, or 0 for the dataset's own size",
    )


def validate(cfg: Config, origins: dict[str, str] | None = None) -> None:
    """Check the ranges of ``cfg``'s values; types, and that floats are finite, were checked when applied.

    Args:
        cfg: the resolved config.
        origins: where a field's value came from, by key (e.g. an environment variable), named in its error.

    Raises:
        UsageError: one line naming the first field out of range.
    """
    d, m, t, r = cfg.data, cfg.model, cfg.train, cfg.run
    origins = origins or {}

    def need(ok: bool, key: str, msg: str) -> None:
        if not ok:
            source = f" (from {origins[key]})" if key in origins else ""
            raise UsageError(f"{key}: {msg}{source}")

    def one_of(value: str, allowed: tuple, key: str) -> None:
        if value not in allowed:
            near = difflib.get_close_matches(value, allowed, n=1)
            hint = f"; did you mean '{near[0]}'?" if near else ""
            raise UsageError(f"{key}: unknown value {brief(value)} (choose from {', '.join(allowed)}){hint}")

    need(
        bool(SAFE.fullmatch(cfg.name)),
        "name",
        f"{show(cfg.name)} cannot name a run directory or job; {SAFE_HINT}; rename the config file "
        "or pass --set name=NAME",
    )
    one_of(d.source, SOURCES, "data.source")
    _check_model(m, need)
    one_of(m.precision, PRECISIONS, "model.precision")
    one_of(t.schedule, SCHEDULES, "train.schedule")
    one_of(t.warmup, WARMUPS, "train.warmup")
    one_of(t.engine, ENGINES, "train.engine")
    need(not (t.fp16_allreduce and t.engine == "tf"), "train.fp16_allreduce", FP16_ON_TF)
    need(t.batch_size > 0, "train.batch_size", f"must be > 0, got {t.batch_size}")
    need(t.tf_join_timeout_s > 0, "train.tf_join_timeout_s", f"seconds, > 0, got {t.tf_join_timeout_s}")
    need(t.accumulation_steps >= 1, "train.accumulation_steps", f"must be >= 1, got {t.accumulation_steps}")
    need(t.epochs > 0, "train.epochs", f"must be > 0, got {t.epochs}")
    need(t.base_lr > 0, "train.base_lr", f"must be > 0, got {t.base_lr}")
    need(t.reference_batch > 0, "train.reference_batch", f"must be > 0, got {t.reference_batch}")
    need(t.warmup_epochs >= 0, "train.warmup_epochs", f"must be >= 0, got {t.warmup_epochs}")
    need(
        t.warmup_epochs < t.epochs or t.warmup_epochs == 0,
        "train.warmup_epochs",
        f"{t.warmup_epochs} is not shorter than train.epochs ({t.epochs}); lower it or train longer",
    )
    need(0 <= t.momentum < 1, "train.momentum", f"must be in [0, 1), got {t.momentum}")
    need(0 < t.decay_factor <= 1, "train.decay_factor", f"must be in (0, 1], got {t.decay_factor}")
    need(
        all(a < b for a, b in pairwise(t.decay_epochs)) and all(e > 0 for e in t.decay_epochs),
        "train.decay_epochs",
        f"must be strictly increasing positive epochs (each once), got {brief(t.decay_epochs)}",
    )
    need(t.steps_per_epoch >= 0, "train.steps_per_epoch", f"must be >= 0, got {t.steps_per_epoch}")
    need(t.eval_steps >= 0, "train.eval_steps", f"must be >= 0, got {t.eval_steps}")
    need(m.weight_decay >= 0, "model.weight_decay", f"must be >= 0, got {m.weight_decay}")
    need(0 <= m.label_smoothing < 1, "model.label_smoothing", f"must be in [0, 1), got {m.label_smoothing}")
    need(d.image_size >= 0, "data.image_size", f"must be >= 0, got {d.image_size}")
    _check_image_size(m, d, need)
    _check_data(d, need)
    need(0 <= r.seed <= SEED_MAX, "run.seed", f"must be in 0..{SEED_MAX}, got {r.seed}")
    need(r.keep_checkpoints >= 1, "run.keep_checkpoints", f"must be >= 1, got {r.keep_checkpoints}")
    need(r.log_every >= 1, "run.log_every", f"must be >= 1, got {r.log_every}")
    need(r.stop_check_every >= 1, "run.stop_check_every", f"must be >= 1, got {r.stop_check_every}")
    checkpoint_interval(r.checkpoint_every)  # raises with the accepted forms


def _check_data(d: DataConfig, need: Callable[[bool, str, str], None]) -> None:
    """The ranges of ``data``'s values, and what each source needs."""
    need(d.num_classes >= 0, "data.num_classes", f"must be >= 0, got {d.num_classes}")
    need(d.shuffle_buffer >= 1, "data.shuffle_buffer", f"must be >= 1, got {d.shuffle_buffer}")
    need(d.synthetic_examples > 0, "data.synthetic_examples", f"must be > 0, got {d.synthetic_examples}")
    need(d.channels in (0, 1, 3), "data.channels", f"must be 0 (from the data), 1 or 3, got {d.channels}")
    if d.source == "synthetic":
        need(d.num_classes > 0, "data.num_classes", "must be set (> 0) for synthetic data")
    if d.source == "imagenet":
        need(
            bool(d.data_dir),
            "data.data_dir",
            "must name the ImageNet TFRecord folder (train-*, validation-*)",
        )
    if d.source == "python":
        try:
            users = modelref.parse(d.name, "data.name").is_users
        except UsageError:
            users = False
        need(
            users,
            "data.name",
            "data.source python takes path/to/file.py:function or package.module:function, "
            f"got {show(d.name)}",
        )
        need(d.num_classes >= 2, "data.num_classes", "must be set (>= 2) for data.source python")
        need(
            d.image_size == 0,
            "data.image_size",
            "data.source python takes images as the function returns them: resize them there and leave "
            "data.image_size at 0",
        )


def checkpoint_interval(value: str) -> tuple[str, float] | None:
    """``run.checkpoint_every`` as ("seconds", s) or ("steps", n), or None when empty.

    Converted once, here.

    Raises:
        UsageError: neither a duration nor a number of steps; the message names the accepted forms.
    """
    text = str(value).strip()
    if not text:
        return None
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*(s|m|h|steps?)?", text)
    number = float(m.group(1)) if m else 0.0
    if (
        not m
        or number <= 0
        or not math.isfinite(number)
        or (m.group(2) in (None, "step", "steps") and number != int(number))
    ):
        raise UsageError(
            f"run.checkpoint_every: {brief(text)} is not an interval; use a duration like 30m, 2h or 90s, "
            "a number of steps like 2000, or '' for epoch ends only"
        )
    unit = m.group(2)
    if unit in (None, "step", "steps"):
        return "steps", int(number)
    return "seconds", number * {"s": 1, "m": 60, "h": 3600}[unit]
