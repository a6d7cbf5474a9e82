"""A config resolved: YAML files and ``--set key=value`` overrides applied to the schema, then validated.

The schema is app.core.schema and the range checks app.core.validation. Precedence, lowest first: schema
defaults < ``--config FILE`` (repeatable, in order; a file may name a ``base:`` file it extends) <
``--set key=value`` < explicit CLI options (which Click also reads from ``APP_*`` environment variables). The
resolved config is written to ``<run_dir>/config.yaml`` and a run is resumed from it. Unknown keys are errors
that suggest the nearest valid key; every value is type- and range-checked.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from pathlib import Path

import yaml

from app.core import shipped
from app.core.errors import UsageError, brief, show

# The schema, re-exported: callers name these as app.core.config's.
from app.core.schema import (  # noqa: F401
    ENGINES,
    FP16_ON_TF,
    MIN_IMAGE_SIZE,
    MODELS,
    NAME_MAX,
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
    RunConfig,
    TrainConfig,
)
from app.core.validation import validate
from app.core.yamlfile import ConfigDumper, ConfigLoader, Refused, parse_yaml, read_text

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
    given = Path(path)
    label = f"--config {given}" if not _seen else f"{given} (the base: of {_seen[-1].name})"
    path = shipped.find_config(given)  # configs/NAME.yaml, when not here: scaleout's own
    if not path.exists():
        raise UsageError(shipped.no_such_config(label) if not _seen else f"{label}: no such file")
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

    Args:
        config_files: the ``--config`` files, applied in order (each after its ``base:`` chain).
        sets: the ``--set key=value`` items.
        options: config values of the command's own options by key; None values were not given.
        base: a saved run's flat values, applied first.
        base_where: how errors name ``base``.
        origins: where an option's value came from when the user may not know (an APP_* environment
            variable), by key, for the range errors of ``validate``.

    Raises:
        UsageError: an unknown key, a value of the wrong type or out of range, a file that cannot be read.
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


def flat(cfg: Config) -> dict[str, object]:
    """``section.key -> value`` for every field (for diffs between a saved run and a resume)."""
    return flatten(cfg.to_dict(), "config")


def dump(cfg: Config) -> str:
    return yaml.dump(cfg.to_dict(), Dumper=ConfigDumper, sort_keys=False)


def tfds_data_dir(explicit: str | None = None) -> str:
    """The TFDS data dir in use: explicit > $TFDS_DATA_DIR > TFDS's own default (~/tensorflow_datasets)."""
    return explicit or os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")
