"""Experiment files as YAML: a bounded read, and PyYAML's safe loader and dumper with YAML 1.2 numbers.

The loader allows no aliases; invalid files are one-line errors naming the file and line.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from app.core.errors import UsageError, brief, read_regular, show

CONFIG_FILE_LIMIT = 2**20  # bytes: an experiment file is a few hundred; more is the wrong file (or /dev/zero)
MAX_DEPTH = 50  # nesting levels of a config's YAML (its schema has 3)

_INT, _FLOAT, _TIMESTAMP = (f"tag:yaml.org,2002:{t}" for t in ("int", "float", "timestamp"))
# Numbers as YAML 1.2's core schema reads them, not PyYAML's YAML 1.1: 1e-3 is a float (1.1 wants a dot),
# 1:30 and 1_000 are strings (1.1: 90 and 1000), 010 is ten (1.1: octal eight), 2024-01-01 is a string.
# .inf and .nan stay floats, for the finite check to refuse them by name.
INT_12 = re.compile(r"(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)\Z")
FLOAT_12 = re.compile(
    r"(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))\Z"
)
MAX_INT_DIGITS = 100  # more is no config value (and Python refuses to convert beyond 4300)


class Refused(yaml.MarkedYAMLError):
    """Valid YAML that a config may not hold (an alias, deep nesting, a huge integer): its own one line."""


class ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with YAML 1.2 numbers (``INT_12``, ``FLOAT_12``) and no aliases.

    An alias (``*a``) can make a 600-byte file a structure of gigabytes, and is never needed in an experiment
    file.
    """

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _FLOAT, _TIMESTAMP)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise Refused(
                problem=(
                    f"YAML aliases (*{show(event.anchor)}) are not allowed in a config; write the value out"
                ),
                problem_mark=event.start_mark,
            )
        if self.depth >= MAX_DEPTH:
            raise Refused(
                problem=f"nested deeper than {MAX_DEPTH} levels; a config has sections, keys and values",
                problem_mark=self.peek_event().start_mark,
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_int12(self, node) -> int:
        text = self.construct_scalar(node)
        if not INT_12.match(text):
            raise yaml.constructor.ConstructorError(
                None, None, f"{brief(text)} is not an integer", node.start_mark
            )
        digits = len(text.lstrip("+-"))
        if digits > MAX_INT_DIGITS:
            raise Refused(
                problem=f"an integer of {digits} digits is out of range", problem_mark=node.start_mark
            )
        base = {"0o": 8, "0x": 16}.get(text[:2], 10)
        return int(text[2:] if base != 10 else text, base)

    def construct_float12(self, node) -> float:
        text = self.construct_scalar(node)
        if not FLOAT_12.match(text):
            raise yaml.constructor.ConstructorError(
                None, None, f"{brief(text)} is not a number", node.start_mark
            )
        lower = text.lower()
        if lower.lstrip("+-") in (".inf", ".nan"):
            return float(lower.replace(".", ""))
        return float(text)  # 1e400 is inf: refused by the finite check with the key's name


ConfigLoader.add_implicit_resolver(_INT, INT_12, list("-+0123456789"))
ConfigLoader.add_implicit_resolver(_FLOAT, FLOAT_12, list("-+.0123456789"))
ConfigLoader.add_constructor(_INT, ConfigLoader.construct_int12)
ConfigLoader.add_constructor(_FLOAT, ConfigLoader.construct_float12)


class ConfigDumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` that also quotes the strings YAML 1.2 reads as numbers ("1e-3").

    So a saved config.yaml reads back the same with :class:`ConfigLoader` and with ``yaml.safe_load``.
    """


ConfigDumper.add_implicit_resolver(_INT, INT_12, list("-+0123456789"))
ConfigDumper.add_implicit_resolver(_FLOAT, FLOAT_12, list("-+.0123456789"))


def parse_yaml(text: str, label: str) -> object:
    """``text`` read by :class:`ConfigLoader`.

    Raises:
        UsageError: one line naming ``label`` (and the line) for invalid YAML or YAML a config may not hold.
    """
    try:
        return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 (a SafeLoader)
    except Refused as exc:
        raise UsageError(f"{label}: line {exc.problem_mark.line + 1}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{label}:{at} is not valid YAML ({problem})") from None
    except RecursionError:
        raise UsageError(f"{label}: nested too deeply to be a config") from None
    except (
        ValueError,
        TypeError,
        AttributeError,
    ) as exc:  # an explicit tag (!!timestamp x) PyYAML trips over
        raise UsageError(f"{label}: not a valid config value ({brief(str(exc))})") from None


def read_text(path: Path, label: str) -> str:
    """A YAML file's contents.

    Raises:
        UsageError: one line naming ``label`` when the file cannot be read, is not a regular file (a device
            or FIFO never ends), is larger than ``CONFIG_FILE_LIMIT`` or is not UTF-8 text.
    """
    data = read_regular(path, label, CONFIG_FILE_LIMIT, "YAML file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{label}: not a UTF-8 text file (undecodable byte at offset {exc.start}); is it a YAML file?"
        ) from None
