"""Blessing rules: thresholds, the served-model baseline, and the errors users see."""

import math

import pytest

from airflow_tf.serving import BlessingConfigError, decide, validate_thresholds

REGRESSION = {"loss": 0.25, "mse": 0.25, "mae": 0.4}
CLASSIFIER = {"loss": 0.3, "accuracy": 0.93, "cross_entropy": 0.3}


def test_thresholds_bless_when_every_bound_holds():
    blessed, checks = decide(REGRESSION, "regression", {"mse": {"max": 1.0}, "mae": {"min": 0.0, "max": 0.5}})
    assert blessed
    assert [c["reason"] for c in checks] == ["mse 0.25 <= max 1", "mae 0.4 >= min 0", "mae 0.4 <= max 0.5"]


def test_one_failed_bound_is_enough_to_refuse_and_is_named():
    blessed, checks = decide(CLASSIFIER, "classification", {"accuracy": {"min": 0.95}, "loss": {"max": 1.0}})
    assert not blessed
    failed = [c for c in checks if not c["passed"]]
    assert [c["reason"] for c in failed] == ["accuracy 0.93 < min 0.95"]


def test_thresholds_arrive_as_json_text_from_templates():
    assert validate_thresholds('{"accuracy": {"min": 0.9}}') == {"accuracy": {"min": 0.9}}
    assert validate_thresholds(None) == {} and validate_thresholds("") == {}


@pytest.mark.parametrize(
    "thresholds, task, message",
    [
        ({"acuracy": {"min": 0.9}}, None, "thresholds['acuracy']: 'acuracy' is not a known metric"),
        ({"accuracy": {"min": 0.9}}, "regression", "not a metric of this regression model; choose from loss, mse, mae"),
        ({"mse": 1.0}, None, "thresholds['mse']: expected {\"min\": number} and/or {\"max\": number}"),
        ({"mse": {"below": 1.0}}, None, "thresholds['mse']: expected"),
        ({"mse": {"max": "small"}}, None, "thresholds['mse']['max']: must be a finite number, got 'small'"),
        ({"mse": {"max": float("nan")}}, None, "must be a finite number"),
        ({"mae": {"min": 2, "max": 1}}, None, "thresholds['mae']: min 2.0 is greater than max 1.0"),
        ("{mse: 1}", None, "thresholds: not valid JSON"),
        (["mse"], None, "thresholds: expected a mapping"),
    ],
)
def test_bad_thresholds_name_the_metric_and_the_fix(thresholds, task, message):
    with pytest.raises(BlessingConfigError) as info:
        validate_thresholds(thresholds, task)
    assert message in str(info.value)


def test_baseline_lower_is_better_for_errors():
    served = {"metrics": {"loss": 0.3, "mse": 0.3, "mae": 0.45}}
    blessed, checks = decide(REGRESSION, "regression", baseline=served)
    assert blessed and checks[0]["reason"] == "mse 0.25 <= served model's 0.3 (lower is better)"
    worse = {"metrics": {"loss": 0.2, "mse": 0.2, "mae": 0.3}}
    blessed, checks = decide(REGRESSION, "regression", baseline=worse)
    assert not blessed and checks[0]["reason"] == "mse 0.25 > served model's 0.2 (lower is better)"


def test_baseline_higher_is_better_for_accuracy_and_metric_can_be_chosen():
    served = {"loss": 0.1, "accuracy": 0.95, "cross_entropy": 0.1}
    assert decide(CLASSIFIER, "classification", baseline=served)[0] is False  # accuracy by default
    blessed, checks = decide(CLASSIFIER, "classification", baseline={"metrics": {**served, "accuracy": 0.93}})
    assert blessed, "equal is good enough: a retrained model as good as the served one is pushed"
    with pytest.raises(BlessingConfigError, match="baseline_metric: 'mse' is not a metric of this classification"):
        decide(CLASSIFIER, "classification", baseline=served, baseline_metric="mse")


def test_thresholds_and_baseline_must_both_hold():
    served = {"metrics": {"mse": 0.5}}
    blessed, checks = decide(REGRESSION, "regression", {"mse": {"max": 0.1}}, baseline=served)
    assert not blessed
    assert [c["passed"] for c in checks] == [False, True]


def test_a_diverged_model_is_never_blessed():
    diverged = {"loss": math.nan, "mse": math.nan, "mae": math.inf}
    blessed, checks = decide(diverged, "regression")
    assert not blessed
    assert any("mse is nan" in c["reason"] for c in checks)


def test_no_rules_blesses_a_finite_model_and_says_so():
    blessed, checks = decide(REGRESSION, "regression")
    assert blessed and "no thresholds and no baseline" in checks[0]["reason"]


def test_an_unblessed_runs_own_facts_name_an_early_checkpoint_stalls_and_sync_drops():
    from airflow_tf.serving.blessing import training_context

    progress = {"global_step": 1500, "target_step": 1500, "done": True, "loss": 0.25,
                "stalls": [{"global_step": 389, "cause": "it ran past its bound of 30 s and TensorFlow cancelled it"}]}
    facts = training_context(progress, checkpoint_step=1200, sync=True, replicas_to_aggregate=2)
    assert facts[0].startswith("training: the evaluated checkpoint is at global step 1200 of the target 1500")
    assert "training: the last reported training loss was 0.25 at global step 1500" in facts
    assert any("1 stuck step(s) were cut" in f and "after global step 389" in f for f in facts)
    assert any("synchronous, 2 gradient(s) per global step" in f and "dropped" in f for f in facts)
    # A run that reached its target asynchronously, without stalls: only its loss.
    assert training_context({**progress, "stalls": []}, 1500, sync=False) == [
        "training: the last reported training loss was 0.25 at global step 1500"]
    assert "no progress report" in training_context(None, 10, sync=False)[0]
