"""The experiment schema: typed dataclasses, YAML files, ``--set key=value`` overrides, validation.

Precedence, lowest first: schema defaults < ``--config FILE`` (repeatable, in order; a file may name a
``base:`` file it extends) < ``--set key=value`` < explicit CLI options (which Click also reads from ``APP_*``
environment variables). The resolved config is written to ``<run_dir>/config.yaml`` and a run is resumed
from it. Unknown keys are errors that suggest the nearest valid key; every value is type- and range-checked.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from app.core.errors import UsageError, brief, show
from app.core.iterables import pairwise
from app.core.yamlfile import ConfigDumper, ConfigLoader, Refused, parse_yaml, read_text

MODELS = ("resnet50", "resnet18", "resnet20", "resnet32", "resnet56")
SOURCES = ("tfds", "imagenet", "synthetic")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
SCHEDULES = ("step", "cosine", "constant")
ENGINES = ("auto", "horovod", "tf")  # app.engines.engine: auto is Horovod where it imports, else tf
WARMUPS = ("gradual", "constant")  # Goyal et al.'s two warmups (see app.training.schedule)
# The experiment's name names its run directory (runs/<name>-<date>) and, through app submit, its Slurm job:
# letters, digits and . _ + - only, never a path, never an option. One definition, used by submit too.
NAME_MAX = 128  # characters; Slurm's own limit for a job name is 1024
SAFE = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.+-]{{0,{NAME_MAX - 1}}}")
SAFE_HINT = f"use letters, digits and . _ + - only (first a letter, digit or _; at most {NAME_MAX})"


@dataclass
class DataConfig:
    source: str = "tfds"  # tfds | imagenet (TFRecords) | synthetic
    name: str = "fashion_mnist"  # TFDS dataset name (source tfds)
    data_dir: Optional[str] = None  # noqa: UP045 (evaluated by get_type_hints: Python 3.9 has no X | None)
    # TFDS data dir or ImageNet TFRecord dir; None: TFDS_DATA_DIR or TFDS default
    train_split: str = "train"
    eval_split: str = "test"
    image_size: int = 0  # 0: the dataset's own size (28 for Fashion-MNIST, 224 for ImageNet), else resized
    num_classes: int = 0  # 0: from the dataset; required for synthetic data
    channels: int = 0  # 0: from the dataset (synthetic: 3)
    synthetic_examples: int = 1281167  # the epoch length of synthetic data (ImageNet-1k's train split)
    shuffle_buffer: int = 10000
    augment: bool = True
    cache: bool = False  # cache decoded examples in memory (small datasets only)
    # Keep the exact example order through parallel decoding: what makes --seed and resume reproducible.
    # false: elements leave the parallel map as they finish, with the same examples and augmentations per
    # epoch in a slightly different order; no measurable throughput difference here (docs/development.md,
    # make bench).
    deterministic: bool = True


@dataclass
class ModelConfig:
    name: str = "resnet20"
    zero_init_residual: bool = True  # zero-init each residual block's last batch-norm gamma (Goyal et al.)
    weight_decay: float = 1e-4  # on conv/dense kernels only, never on batch-norm parameters or biases
    label_smoothing: float = 0.0
    precision: str = "auto"  # bf16: AVX512_BF16 CPUs, Ampere+/MI200+ GPUs; fp16: other GPUs; else float32
    jit_compile: bool = False  # XLA; for GPUs (on the CPU it is ~5x slower for ResNet-50)


@dataclass
class TrainConfig:
    epochs: int = 10
    batch_size: int = 128  # per worker, per backward pass
    accumulation_steps: int = 1  # backward passes per optimizer step (Horovod backward_passes_per_step)
    base_lr: float = 0.1  # the learning rate for a global batch of reference_batch images
    reference_batch: int = 256
    scale_lr: bool = True  # linear scaling rule: lr = base_lr * global_batch / reference_batch
    warmup_epochs: float = 5.0  # warmup from base_lr to the schedule's scaled lr (0: none)
    # gradual: a linear ramp from base_lr to the schedule where the warmup ends (the scaled lr; under cosine a
    # little less); constant: base_lr for warmup_epochs, then the schedule at once (Goyal et al. compare both;
    # gradual is their recipe). app/training/schedule.py has the details.
    warmup: str = "gradual"
    schedule: str = "step"  # step | cosine | constant, over the whole run: a warmup replaces its start
    decay_epochs: list[int] = field(default_factory=lambda: [30, 60, 80])
    decay_factor: float = 0.1
    momentum: float = 0.9
    nesterov: bool = False
    fp16_allreduce: bool = False  # Horovod compression of gradients on the wire
    # Who distributes: horovod (Horovod's Keras integration, the reference study's), tf (TensorFlow's own
    # strategies, for site modules without Horovod) or auto (Horovod where it imports, else tf).
    engine: str = "auto"
    # The tf engine across hosts runs TensorFlow's gRPC server on every interface with no authentication:
    # anyone who reaches a node can run code as you. Refused unless this says yes (docs/engines.md).
    tf_accept_unauthenticated_grpc: bool = False
    # Seconds the tf engine's workers across hosts wait for each other at the start before ending, naming the
    # ones that never came (a peer that never started would otherwise keep the allocation waiting for ever).
    tf_join_timeout_s: float = 600.0
    steps_per_epoch: int = 0  # 0: the whole training split; >0 caps an epoch (quick tests, benchmarks)
    eval_steps: int = 0  # 0: the whole evaluation split


@dataclass
class RunConfig:
    # The run directory is not a config key: it is `app train --run-dir DIR` (default runs/<name>-<date>,
    # under Slurm runs/<name>-<job id>), so one config file can serve many runs.
    seed: int = 0  # 0 .. 2**31-1 (NumPy, TensorFlow and the data pipeline's stateless seeds all accept it)
    keep_checkpoints: int = 3
    log_every: int = 50  # steps between plain progress lines when stdout is not a terminal
    tensorboard: bool = True
    evaluate: bool = True  # evaluate on the eval split after every epoch
    # Extra checkpoints inside epochs that take hours: "30m", "2h", "90s" (wall-clock) or "2000" (steps).
    # "" (default): at epoch ends, and whenever SIGUSR1/SIGTERM asks the run to stop.
    checkpoint_every: str = ""
    # Optimizer updates between the workers' agreement on a stop signal (one tiny allreduce each).
    stop_check_every: int = 10
    # TensorFlow's op determinism: a resumed run ends bitwise equal to an uninterrupted one (slower on GPUs).
    deterministic_ops: bool = False
    # A resume on another number of workers keeps the global batch through train.accumulation_steps; where
    # no whole number of steps can, it stops, unless this accepts the new global batch (and its LR).
    allow_new_global_batch: bool = False


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)
    name: str = "default"  # the experiment's name (from the last config file unless set)

    # Derived values: one definition each, used by training, the header and the tests.
    def global_batch(self, workers: int) -> int:
        return self.train.batch_size * workers * self.train.accumulation_steps

    def scaled_lr(self, workers: int) -> float:
        t = self.train
        return t.base_lr * self.global_batch(workers) / t.reference_batch if t.scale_lr else t.base_lr

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------- loading


def _field_types() -> dict[str, object]:
    """Every settable key as ``section.field`` (or a top-level field) with its type."""
    out: dict[str, object] = {}
    for name, tp in typing.get_type_hints(Config).items():
        if dataclasses.is_dataclass(tp):
            for sub, stp in typing.get_type_hints(tp).items():
                out[f"{name}.{sub}"] = stp
        else:
            out[name] = tp
    return out


FIELDS = _field_types()
SECTIONS = tuple(dict.fromkeys(k.split(".")[0] for k in FIELDS if "." in k))  # data, model, train, run
# Keys that were in the schema once. A value is an error saying what replaced it; a null (which the saved
# config.yaml of an older run holds) is ignored.
REMOVED = {"run.run_dir": "the run directory is not a config key; pass it as `app train --run-dir DIR`"}
SEED_MAX = 2**31 - 1
# The smallest image each model takes: its total stride (ResNet-50: the stride-2 stem conv and max-pool and
# three stride-2 stages, 2**5 = 32; ResNet-18 with its 3x3 stem: three stride-2 stages, 8; the CIFAR ResNets:
# two, 4). Below it the last stages convolve 1x1 maps that are mostly zero padding.
MIN_IMAGE_SIZE = {"resnet50": 32, "resnet18": 8, "resnet20": 4, "resnet32": 4, "resnet56": 4}


def _example(section: str) -> str:
    """``train.epochs=10``: the section's first key with its default, for messages."""
    key = next(k for k in FIELDS if k.startswith(section + "."))
    value = flat(Config())[key]
    return f"{key}={value}"


def _unknown(key: str, where: str, value: object = None) -> UsageError:
    """An unknown key, with the valid key it most likely meant (only a close match), else what is valid."""
    section, dot, name = key.partition(".")
    names = {k.partition(".")[2]: k for k in reversed(FIELDS) if "." in k}  # bare name -> first full key
    near: list[str] = []
    if not dot:
        if key in names:  # a bare field name without its section: train.batch_size for batch_size
            near = [names[key]]
        elif isinstance(value, dict) or difflib.get_close_matches(key, SECTIONS, n=1, cutoff=0.6):
            near = difflib.get_close_matches(key, SECTIONS, n=1, cutoff=0.6)
            hint = f"did you mean '{near[0]}'?" if near else f"the sections are {', '.join(SECTIONS)}"
            return UsageError(f"{where}: unknown section {brief(key)}; {hint}")
        else:
            near = [names[n] for n in difflib.get_close_matches(key, list(names), n=1, cutoff=0.8)]
        hint = (
            f"did you mean '{near[0]}'?"
            if near
            else f"top-level keys are the sections {', '.join(SECTIONS)} and 'name'"
        )
        return UsageError(f"{where}: unknown key {brief(key)}; {hint}")
    if section not in SECTIONS:
        fixed = difflib.get_close_matches(section, SECTIONS, n=1, cutoff=0.6)
        if fixed and f"{fixed[0]}.{name}" in FIELDS:
            return UsageError(
                f"{where}: unknown key {brief(key)}; did you mean {brief(f'{fixed[0]}.{name}')}?"
            )
        hint = f"did you mean '{fixed[0]}'?" if fixed else f"the sections are {', '.join(SECTIONS)}"
        return UsageError(f"{where}: unknown key {brief(key)}: no section {brief(section)}; {hint}")
    own = [k.partition(".")[2] for k in FIELDS if k.startswith(section + ".")]
    near = [f"{section}.{n}" for n in difflib.get_close_matches(name, own, n=1, cutoff=0.7)]
    if not near and name in names:  # the right name in the wrong section: run.seed for train.seed
        near = [names[name]]
    hint = f"did you mean '{near[0]}'?" if near else f"the keys of '{section}' are {', '.join(own)}"
    return UsageError(f"{where}: unknown key {brief(key)}; {hint}")


def _coerce(key: str, value, tp, where: str):
    """Check ``value`` against the schema type ``tp``; ints are accepted for floats, floats must be finite."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, getattr(types, "UnionType", typing.Union)):  # UnionType: X | Y, Python 3.10+
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        tp = next(a for a in args if a is not type(None))
        origin = typing.get_origin(tp)
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list):
            raise UsageError(f"{where}: {key} must be a list of {item.__name__}, got {brief(value)}")
        return [_coerce(key, v, item, where) for v in value]
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise UsageError(f"{where}: {key} must be a finite number, got {brief(value)}")
        return number
    if tp is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise UsageError(f"{where}: {key} must be {tp.__name__}, got {brief(value)} ({type(value).__name__})")
    return value


def flatten(tree: dict, where: str, prefix: str = "") -> dict[str, object]:
    """A YAML tree of sections as flat ``section.key`` values; ``where`` names it in errors."""
    flat: dict[str, object] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if not prefix and key in SECTIONS and not isinstance(v, dict):
            if v is None:  # "train:" with nothing below it: an empty section
                continue
            raise UsageError(
                f"{where}: section '{key}' must be a mapping of its keys (e.g. '{key}:' with "
                f"'  {_example(key).partition('.')[2].replace('=', ': ')}' below it), "
                f"got {type(v).__name__} {brief(v)}"
            )
        if isinstance(v, dict) and any(f.startswith(key + ".") for f in FIELDS):
            flat.update(flatten(v, where, key + "."))
        else:
            flat[key] = v
    return flat


def apply(cfg: Config, values: dict[str, object], where: str) -> Config:
    """Set dotted keys on ``cfg`` after checking each name and type; ``where`` names the source in errors."""
    for key, value in values.items():
        if key in REMOVED:
            if value is None:
                continue
            raise UsageError(f"{where}: {key}: {REMOVED[key]}")
        if key in SECTIONS:  # --set train=5
            raise UsageError(f"{where}: '{key}' is a section; set one of its keys, e.g. {_example(key)}")
        if key not in FIELDS:
            raise _unknown(key, where, value)
        value = _coerce(key, value, FIELDS[key], where)
        if "." in key:
            section, name = key.split(".", 1)
            setattr(getattr(cfg, section), name, value)
        else:
            setattr(cfg, key, value)
    return cfg


def load_yaml(path: str | Path, _seen: tuple = ()) -> dict[str, object]:
    """Read one experiment file (following its ``base:`` chain) as flat ``section.key`` values."""
    path = Path(path)
    label = f"--config {path}" if not _seen else f"{path} (the base: of {_seen[-1].name})"
    if not path.exists():
        hint = "; the shipped configs are in configs/" if not _seen else ""
        raise UsageError(f"{label}: no such file{hint}")
    if path.resolve() in _seen:
        raise UsageError(f"{path}: 'base:' chain loops back to itself")
    tree = parse_yaml(read_text(path, label), str(path)) or {}
    if not isinstance(tree, dict):
        raise UsageError(
            f"{path}: must be a mapping of sections ({', '.join(SECTIONS)}), got {type(tree).__name__}"
        )
    values: dict[str, object] = {}
    base = tree.pop("base", None)
    if base is not None:
        if not isinstance(base, str):
            raise UsageError(f"{path}: 'base:' must name one YAML file, got {brief(base)}")
        values.update(load_yaml(path.parent / base, (*_seen, path.resolve())))
    values["name"] = path.stem
    values.update(flatten(tree, str(path)))
    return values


def parse_set(items: typing.Iterable[str]) -> dict[str, object]:
    """``--set train.batch_size=64`` items to values; the value is parsed as YAML (numbers, lists, bools)."""
    values: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set {brief(item)}: expected KEY=VALUE, e.g. --set train.batch_size=64")
        try:
            values[key] = yaml.load(raw, Loader=ConfigLoader) if raw.strip() else None  # noqa: S506
        except Refused as exc:
            raise UsageError(f"--set {show(key)}: {exc.problem}") from None
        except RecursionError:
            raise UsageError(f"--set {show(key)}: nested too deeply to be a config value") from None
        except (yaml.YAMLError, ValueError, TypeError, AttributeError):
            values[key] = raw  # not YAML: the text itself (a path, a name), type-checked like any value
    return values


def build(
    config_files: typing.Sequence[str] = (),
    sets: typing.Iterable[str] = (),
    options: dict[str, object] | None = None,
    base: dict[str, object] | None = None,
    base_where: str = "saved run config",
    origins: dict[str, str] | None = None,
) -> Config:
    """Resolve a config: defaults < ``base`` (a saved run) < files < ``--set`` < CLI options; then validate.

    ``origins`` names where an option's value came from when the user may not know (an APP_* environment
    variable), for the range errors of ``validate``.
    """
    cfg = Config()
    origins = dict(origins or {})
    if base:
        apply(cfg, base, base_where)
        origins["name"] = base_where
    for path in config_files:
        apply(cfg, load_yaml(path), str(path))
        origins["name"] = f"config {show(path, limit=None)}"  # its name: key, else its file name
    set_values = parse_set(sets)
    apply(cfg, set_values, "--set")
    if "name" in set_values:
        origins["name"] = "--set name"
    given = {k: v for k, v in (options or {}).items() if v is not None}
    for key, value in given.items():
        apply(cfg, {key: value}, origins.get(key, "option"))
    validate(cfg, origins)
    return cfg


FP16_ON_TF = (
    "Horovod's compression of gradients on the wire, which the tf engine lacks; set it to false, "
    "or use --engine horovod"
)


def validate(cfg: Config, origins: dict[str, str] | None = None) -> None:
    """Range checks naming the field (and ``origins[field]``, e.g. an environment variable, when given).
    Types, and that floats are finite, were checked when the values were applied."""
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
    one_of(m.name, MODELS, "model.name")
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
    smallest = MIN_IMAGE_SIZE[m.name]
    need(
        d.image_size == 0 or d.image_size >= smallest,
        "data.image_size",
        f"{m.name} needs images of at least {smallest} px, got {d.image_size}; "
        f"use >= {smallest}, or 0 for the dataset's own size",
    )
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
    need(0 <= r.seed <= SEED_MAX, "run.seed", f"must be in 0..{SEED_MAX}, got {r.seed}")
    need(r.keep_checkpoints >= 1, "run.keep_checkpoints", f"must be >= 1, got {r.keep_checkpoints}")
    need(r.log_every >= 1, "run.log_every", f"must be >= 1, got {r.log_every}")
    need(r.stop_check_every >= 1, "run.stop_check_every", f"must be >= 1, got {r.stop_check_every}")
    checkpoint_interval(r.checkpoint_every)  # raises with the accepted forms


def checkpoint_interval(value: str) -> tuple[str, float] | None:
    """``run.checkpoint_every`` as ("seconds", s) or ("steps", n), or None when empty. Converted once,
    here."""
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


def flat(cfg: Config) -> dict[str, object]:
    """``section.key -> value`` for every field (for diffs between a saved run and a resume)."""
    return flatten(cfg.to_dict(), "config")


def dump(cfg: Config) -> str:
    return yaml.dump(cfg.to_dict(), Dumper=ConfigDumper, sort_keys=False)


def tfds_data_dir(explicit: str | None = None) -> str:
    """The TFDS data dir in use: explicit > $TFDS_DATA_DIR > TFDS's own default (~/tensorflow_datasets)."""
    return explicit or os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")
