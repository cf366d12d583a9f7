"""Options declared once: a dataclass field per option carrying its default, its documentation
and, for a number, its :class:`Bounds`. The flags of the command line, the checks and the
``:param:`` lines of the operators are made from these declarations (prepare's options in
:mod:`airflow_tf.data.options`, a group's in :mod:`airflow_tf.cluster.group_options`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any
from collections.abc import Iterable, Mapping


@dataclass(frozen=True)
class Bounds:
    """Where a number option must lie; ``str()`` says it as an error does (``in [0, 1)``,
    ``between 1 and 10,000``, ``at least 1``, ``positive``), with ``why`` in brackets."""

    low: float
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    def holds(self, value: float) -> bool:  # False for NaN: every comparison with it is
        above = value > self.low if self.low_open else value >= self.low
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def __str__(self) -> str:
        if self.high is not None and (self.low_open or self.high_open):
            words = f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        elif self.high is not None:
            words = f"between {self.low:,} and {self.high:,}"
        elif self.low_open:
            words = "positive" if self.low == 0 else f"above {self.low:g}"
        else:
            words = f"at least {self.low:g}"
        return f"{words} ({self.why})" if self.why else words


def option(default: Any, doc: str, *, bounds: Bounds | None = None, unset: Any = None, note: str = "",
           python: str = "", cli: Mapping[str, Any] | None = None) -> Any:
    """An option, declared once: its default, its documentation and, for a number, its bounds.
    ``unset``: what None stands for, when it stands for something (the default then shown);
    ``note``: said after the default; ``python``: what only the Python parameter takes (a dict,
    a list); ``cli``: the flag's own argparse settings (``metavar``, ``action``, ``choices``),
    its ``note``, its ``flag`` when not the option's name, and ``zero``: what 0 means on the
    command line, where it stands for None."""
    metadata = {"doc": doc, "bounds": bounds, "unset": unset, "note": note, "python": python, "cli": dict(cli or {})}
    return dataclasses.field(default=default, metadata=metadata)


def _shown_default(field: dataclasses.Field, also: str = "") -> str:
    """`` (default 0.2)``, `` (default: the cores ...)``, `` (default 300; 0 never)`` or nothing."""
    unset = field.metadata["unset"]
    value = field.default if unset is None else unset
    if value is None or (unset is None and isinstance(value, (bool, tuple))):
        words = ""  # nothing to show: no value, or a flag's absence
    elif isinstance(value, str) and " " in value:
        words = f"default: {value}"
    else:
        words = f"default {value:g}" if isinstance(value, float) else f"default {value}"
    inside = "; ".join(filter(None, (words, also)))
    return f" ({inside})" if inside else ""


def flag_help(field: dataclasses.Field) -> str:
    """The help of an option's flag on the command line."""
    meta, cli = field.metadata, field.metadata["cli"]
    return "; ".join(filter(None, (meta["doc"] + _shown_default(field, cli.get("zero", "")), meta["note"],
                                   cli.get("note"))))


def parameter_doc(field: dataclasses.Field) -> str:
    """The documentation of an option as a Python parameter (operator, function, options)."""
    meta = field.metadata
    return "; ".join(filter(None, (meta["doc"] + _shown_default(field), meta["python"], meta["note"]))) + "."


def parameter_docs(fields: Iterable[dataclasses.Field], names: Mapping[str, str] | None = None,
                   indent: str = "    ") -> str:
    """A ``:param name: ...`` line per option (``names``: a parameter named otherwise)."""
    names = names or {}
    return f"\n{indent}".join(f":param {names.get(f.name, f.name)}: {parameter_doc(f)}" for f in fields)


def kind(field: dataclasses.Field) -> str:
    """``int``, ``float``, ``str``, ``bool``, ``tuple`` ...: the first type of the field's annotation."""
    return str(field.type).split(" | ")[0].split("[")[0]


def flag_name(field: dataclasses.Field) -> str:
    """``--eval-fraction`` for ``eval_fraction``, or the flag the declaration names."""
    return "--" + field.metadata["cli"].get("flag", field.name).replace("_", "-")


def flag_settings(field: dataclasses.Field) -> dict[str, Any]:
    """The argparse settings of an option's flag: its help, type, default and own settings."""
    settings = {key: value for key, value in field.metadata["cli"].items() if key not in ("note", "flag", "zero")}
    # argparse formats help with %: a literal one is doubled.
    settings["help"] = flag_help(field).replace("``", "").replace("%", "%%")
    field_kind = kind(field)
    if field_kind == "bool":
        settings["action"] = "store_true"
    elif settings.get("action") == "append":  # a list: given by repeating the flag
        settings.setdefault("default", None)
    else:
        settings["default"] = field.default if isinstance(field.default, (int, float)) else None
        if field_kind in ("int", "float"):
            settings["type"] = int if field_kind == "int" else float
    return settings
