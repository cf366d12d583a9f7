"""Kubernetes quantities are read by one parser, with Kubernetes' own grammar, wherever a user writes
one: pod resources and ``shm_size``, the CLI's ``--cpu``/``--memory``, ``ps_memory_limit`` and the
local backend's memory admission all accept and refuse the same forms."""

from __future__ import annotations

from decimal import Decimal

import pytest
import yaml

from airflow_tf.backends.base import BackendError
from airflow_tf.backends.kubernetes.pod_options import check_resources
from airflow_tf.backends.local.memory import memory_mib
from airflow_tf.cli import main
from airflow_tf.cluster import SpecError, TrainingConfig
from airflow_tf.cluster.memory import memory_bytes, parse_quantity

ACCEPTED = [
    ("2", Decimal(2)), ("500m", Decimal("0.5")), ("4Gi", Decimal(4 * 2**30)), ("1500k", Decimal(1_500_000)),
    ("1.5Gi", Decimal(3 * 2**29)), (".5", Decimal("0.5")), ("5.", Decimal(5)), ("1e9", Decimal(10**9)),
    ("15E-1", Decimal("1.5")), ("1E3", Decimal(1000)), ("2M", Decimal(2 * 10**6)), ("3Ti", Decimal(3 * 2**40)),
    ("100n", Decimal("1E-7")), ("1E", Decimal(10**18)), ("+1Ki", Decimal(1024)), (2, Decimal(2)), (0.25, Decimal("0.25")),
]
REFUSED = ["1K", "1KB", "4 GiB", "1.5.0", "-1Gi", "lots", "", "Gi", "1e", "1ki", "1mi", "1e1.5", ".", "nan"]


@pytest.mark.parametrize(("text", "value"), ACCEPTED)
def test_kubernetes_forms_are_read_to_their_value(text, value):
    assert parse_quantity(text, "x") == value


@pytest.mark.parametrize("text", [*REFUSED, float("nan"), float("inf"), True, None, ["1Gi"]])
def test_other_forms_are_refused_naming_the_field_and_what_to_write(text):
    with pytest.raises(ValueError) as caught:
        parse_quantity(text, "roles.ps.resources.limits.memory")
    message = str(caught.value)
    assert message.startswith(f"roles.ps.resources.limits.memory: {text!r} is not a Kubernetes quantity")
    assert "e.g. 2, 500m, 4Gi" in message and "lower-case k" in message


def render_ps_memory(capsys, *flags: str) -> str:
    """The ps container's memory request ``airflow-tf render`` prints."""
    assert main(["render", "--name", "demo", "--image", "registry.example/tf:2.21", *flags]) == 0
    jobs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d["kind"] == "Job"]
    ps = next(d for d in jobs if d["metadata"]["name"] == "demo-ps")
    return ps["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"]


def test_every_reader_accepts_1500k_and_refuses_1K(capsys):
    """The pod resources, the CLI, ps_memory_limit and the local admission agree."""
    assert check_resources("ps", {"requests": {"memory": "1500k"}}) == {"requests": {"memory": "1500k"}}
    with pytest.raises(SpecError, match=r"roles.ps.resources.requests.memory: '1K' is not a Kubernetes quantity"):
        check_resources("ps", {"requests": {"memory": "1K"}})
    assert render_ps_memory(capsys, "--memory", "ps=1500k") == "1500k"
    config = {"dataset": "/data/x/1", "run_dir": "/runs/x", "steps": 10}
    assert TrainingConfig(**config, ps_memory_limit="1500k").ps_memory_limit == "1500k"
    with pytest.raises(ValueError, match=r"\n  ps_memory_limit: '1K' is not a positive Kubernetes quantity"):
        TrainingConfig(**config, ps_memory_limit="1K")
    assert memory_mib("1500k") == pytest.approx(1_500_000 / 2**20)
    with pytest.raises(BackendError, match=r"^roles.ps.resources.requests.memory: '1K' is not a positive Kubernetes"):
        memory_mib("1K", "roles.ps.resources.requests.memory")


def test_a_memory_below_one_byte_is_refused_as_the_milli_slip_it_likely_is():
    with pytest.raises(ValueError, match=r"^ps_memory_limit: '512m' is 0.512 bytes \(m means milli\); write Mi or M"):
        memory_bytes("512m", "ps_memory_limit")
    assert memory_bytes("1.5", "ps_memory_limit") == 2, "a fraction of a byte is rounded up, as Kubernetes does"


def test_a_cli_quantity_must_be_positive_and_the_error_shows_the_flag_form(capsys):
    for bad in ("ps=0", "ps=1K"):
        with pytest.raises(SystemExit):
            main(["render", "--name", "demo", "--image", "registry.example/tf:2.21", "--memory", bad])
        err = capsys.readouterr().err
        assert f"argument --memory: {bad!r}: {bad[3:]!r} is not a positive Kubernetes quantity (e.g. ps=2Gi" in err, err
