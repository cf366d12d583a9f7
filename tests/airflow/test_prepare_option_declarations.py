"""Prepare's options are declared once, as PrepareOptions' fields: ``airflow-tf prepare``'s flags
(name, help, default), the prepare operator's and ``prepare_dataset``'s parameters (default) and
their documentation are made from or checked against them. A default or a text changed on one
side only, or a new option one side lacks, fails here."""

from __future__ import annotations

import dataclasses
import inspect
import argparse
import math
import re
from pathlib import Path

import pytest

from airflow_tf.cli import _add_prepare
from airflow_tf.data import prepare_dataset
from airflow_tf.cluster.declarations import Bounds, flag_help, parameter_doc
from airflow_tf.data.options import PrepareOptions
from airflow_tf.operators import PrepareTFRecordsOperator
from airflow_tf.task_groups import _PLAN_ARGUMENTS, tf_prepare

ROOT = Path(__file__).resolve().parents[2]

# A parameter that takes None for an option whose own default is empty (no columns).
NONE_FOR_EMPTY = ("string_columns",)


def disagreements(signature: inspect.Signature) -> list[str]:
    """How a signature's parameters differ from PrepareOptions' fields: a missing option, or a
    default of another value or type."""
    found = []
    for option in dataclasses.fields(PrepareOptions):
        if option.name not in signature.parameters:
            found.append(f"{option.name}: PrepareOptions has it, the parameters do not")
            continue
        given = signature.parameters[option.name].default
        expected = None if option.name in NONE_FOR_EMPTY else option.default
        if given != expected or type(given) is not type(expected):
            found.append(f"{option.name}: the parameter's default is {given!r}, PrepareOptions' {expected!r}")
    return found


@pytest.mark.parametrize("callable_", [PrepareTFRecordsOperator.__init__, prepare_dataset])
def test_the_prepare_parameters_defaults_are_prepare_options(callable_):
    assert disagreements(inspect.signature(callable_)) == []


def test_a_default_changed_on_one_side_or_an_option_a_side_lacks_is_reported():
    signature = inspect.signature(prepare_dataset)
    drifted = signature.replace(parameters=[p.replace(default=0.25) if p.name == "eval_fraction" else p
                                            for p in signature.parameters.values() if p.name != "seed"])
    assert disagreements(drifted) == ["eval_fraction: the parameter's default is 0.25, PrepareOptions' 0.2",
                                      "seed: PrepareOptions has it, the parameters do not"]


def _prepare_parser() -> argparse.ArgumentParser:
    """The parser of ``airflow-tf prepare``, as the command line adds it."""
    sub = argparse.ArgumentParser(prog="airflow-tf").add_subparsers()
    _add_prepare(sub)
    return sub.choices["prepare"]


def test_every_prepare_option_is_a_flag_with_its_declared_help_and_default():
    flags = {a.dest: a for a in _prepare_parser()._actions}
    for option in dataclasses.fields(PrepareOptions):
        action = flags[option.name]
        assert action.option_strings == ["--" + option.name.replace("_", "-")]
        assert action.help == flag_help(option).replace("``", ""), option.name
        if isinstance(option.default, (int, float)) and not isinstance(option.default, bool):
            assert action.default == option.default and type(action.default) is type(option.default), option.name
    help_text = " ".join(_prepare_parser().format_help().split())
    assert "share of rows held out for evaluation (default 0.2)" in help_text
    assert "target size of each file in MiB (default 128)" in help_text
    assert "memory for rows being read and encoded, in MiB (default 512); the input may be larger" in help_text


def test_the_operators_and_the_options_reference_document_each_option_as_declared():
    for documented in (PrepareTFRecordsOperator, PrepareOptions):
        doc = inspect.getdoc(documented) or ""
        assert "{prepare_options}" not in doc
        for option in dataclasses.fields(PrepareOptions):
            assert option.metadata["doc"], f"PrepareOptions.{option.name} has no documentation"
            assert f":param {option.name}: {parameter_doc(option)}" in doc, (documented.__name__, option.name)
    assert len(re.findall(r":param eval_fraction:", inspect.getdoc(PrepareTFRecordsOperator) or "")) == 1


def test_bounds_say_what_they_hold_and_refuse_nan():
    assert str(Bounds(0, 1, high_open=True)) == "in [0, 1)"
    assert str(Bounds(1, 10_000)) == "between 1 and 10,000"
    assert str(Bounds(0, low_open=True, why="MiB per train file")) == "positive (MiB per train file)"
    assert str(Bounds(1)) == "at least 1"
    fraction = Bounds(0, 1, high_open=True)
    assert fraction.holds(0) and fraction.holds(0.99) and not fraction.holds(1) and not fraction.holds(math.nan)


def test_tf_prepares_documentation_names_every_prepare_option_and_the_encode_threads_default():
    doc = inspect.getdoc(tf_prepare) or ""
    options = re.search(r":param options:(.*?)(?=\n:param|\Z)", doc, flags=re.S)
    assert options is not None
    threads = {f.name: f for f in dataclasses.fields(PrepareOptions)}["encode_threads"]
    assert set(re.findall(r"``(\w+)``", options[1])) == set(PrepareOptions.names()) - {"encode_threads"} | set(
        _PLAN_ARGUMENTS)
    line = " ".join(re.search(r":param encode_threads:(.*?)(?=\n:param)", doc, flags=re.S)[1].split())
    assert threads.metadata["doc"] in line and f"(default: {threads.metadata['unset']})" in line, line
    assert inspect.signature(tf_prepare).parameters["encode_threads"].default == threads.default


def _stated_defaults(text: str) -> dict[str, str]:
    """Option name -> the default the prose states: ``--eval-fraction`` (default 0.2), or
    ``buffer_mib``, default 512."""
    text = " ".join(text.split())
    stated = {flag.replace("-", "_"): value for flag, value in
              re.findall(r"`--([a-z-]+)`(?: [^`(]*)?\(default ([\d.]+)", text)}
    stated.update(re.findall(r"`([a-z_]+)`, default ([\d.]+)", text))
    return stated


def test_the_datasets_reference_states_each_default_as_prepare_options_declares_it():
    stated = _stated_defaults((ROOT / "docs" / "reference" / "datasets.md").read_text(encoding="utf-8"))
    assert {"eval_fraction", "target_shard_mib", "buffer_mib"} <= set(stated), stated
    fields = {f.name: f for f in dataclasses.fields(PrepareOptions)}
    for name, value in stated.items():
        declared = fields[name].metadata["unset"] if fields[name].default is None else fields[name].default
        assert float(value) == declared, f"docs/reference/datasets.md says {name} defaults to {value}, not {declared}"


def test_a_stated_default_is_found_however_the_prose_wraps():
    assert _stated_defaults("`--eval-fraction` (default 0.25) with `--seed`. `--target-shard-mib`\n  (default 64 MiB "
                            "per file); (operator:\n  `buffer_mib`, default 256)") == {
        "eval_fraction": "0.25", "target_shard_mib": "64", "buffer_mib": "256"}
