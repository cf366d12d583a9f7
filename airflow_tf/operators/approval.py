"""ApproveExportOperator: a person approves or rejects the export of an evaluated model through
Airflow's human-in-the-loop approval (Airflow 3.1+, ``apache-airflow-providers-standard``).

Importing this module on an older Airflow raises :class:`airflow_tf.compat.AirflowFeatureUnavailable` naming
Airflow 3.1; nothing else of airflow-tf imports it unless approval is asked for."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any
from collections.abc import Sequence

from airflow.providers.common.compat.sdk import AirflowFailException, AirflowSkipException

from airflow_tf.cluster.results import EvaluationResult
from airflow_tf.cluster.review import review_body, review_subject

from airflow_tf.compat import require

from .common import check_name, no_retry_for

_hitl = require("hitl", "Approval before export (approval=True)")
if TYPE_CHECKING:
    from airflow.providers.standard.operators.hitl import ApprovalOperator
else:
    ApprovalOperator = _hitl.ApprovalOperator

ON_TIMEOUT = ("reject", "approve", "fail")


class ApproveExportOperator(ApprovalOperator):
    """Asks a person to approve the export of an evaluated model, showing its metrics, the
    thresholds, the comparison with the served model and, in a sweep, the other runs; the task
    waits (in Airflow 3.3's ``awaiting input`` state) until someone answers in the UI's
    "Required actions" or through the REST API
    (``PATCH .../taskInstances/<task_id>/<map_index>/hitlDetails``).

    Approve: the export runs. Reject: the export is skipped and the run ends without a new
    version; this task's log and result say who rejected it. A model that is not blessed is not
    put to a person: this task and the export are skipped. Returns (XCom)
    ``{"approved", "decision", "by", "at", "model_name", "run_dir"}``.

    :param evaluation: the evaluate task's XCom (``evaluate.output``; in a sweep the chosen run's).
    :param model_name: the model the export publishes.
    :param candidates: in a sweep: every run's evaluation (``evaluate.output`` of the mapped
        task), shown next to the chosen one.
    :param response_timeout: how long to wait for an answer; None waits until someone answers.
    :param on_timeout: what no answer within ``response_timeout`` means: ``reject`` (default,
        no new version), ``approve`` (export) or ``fail`` (the task and the run fail).
    :param subject: the request's headline while the task is defined; when it runs, the headline
        names the model, the run and its step.
    Other parameters: those of Airflow's ``ApprovalOperator`` (``notifiers``, ``assigned_users``, ...).
    """

    template_fields: Sequence[str] = (*_hitl.ApprovalOperator.template_fields, "evaluation", "candidates",
                                      "model_name")
    ui_color = "#fff59d"

    def __init__(self, *, evaluation: Any, model_name: str, candidates: Any = None,
                 response_timeout: timedelta | None = None, on_timeout: str = "reject",
                 subject: str | None = None, **kwargs: Any) -> None:
        if on_timeout not in ON_TIMEOUT:
            raise ValueError(f"on_timeout: {on_timeout!r} is not one of {', '.join(ON_TIMEOUT)}")
        check_name(model_name, "model_name")
        defaults = {"reject": self.REJECT, "approve": self.APPROVE, "fail": None}[on_timeout]
        super().__init__(subject=subject or f"Export {model_name}?", defaults=defaults,
                         response_timeout=response_timeout, **kwargs)
        self.evaluation = evaluation
        self.model_name = model_name
        self.candidates = candidates
        self.on_timeout = on_timeout

    def _evaluation(self) -> EvaluationResult:
        with no_retry_for(ValueError, what="evaluation"):
            return EvaluationResult.from_dict(self.evaluation)

    def execute(self, context: Any) -> Any:
        evaluation = self._evaluation()
        if not evaluation.blessed:
            raise AirflowSkipException(f"the model of {evaluation.run_dir} is not blessed ({evaluation.reasons}): "
                                       "nothing to approve, it is not exported")
        with no_retry_for(ValueError, what="candidates"):
            candidates = [EvaluationResult.from_dict(c) for c in (self.candidates or [])]
        self.subject = review_subject(self.model_name, evaluation)
        self.body = review_body(self.model_name, evaluation, candidates)
        self.log.info("waiting for a person to approve the export of %s from %s (%s); on timeout: %s",
                      self.model_name, evaluation.run_dir, self.response_timeout or "no timeout", self.on_timeout)
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        evaluation = self._evaluation()
        if event.get("error_type") == "timeout":
            raise AirflowFailException(f"no answer within {self.response_timeout} (on_timeout='fail'): the model of "
                                       f"{evaluation.run_dir} is not exported")
        # The answer, checked by the human-in-the-loop base (a valid option, the form's params).
        answer = _hitl.HITLOperator.execute_complete(self, context=context, event=event)
        approved = answer["chosen_options"] == [self.APPROVE]
        user = answer.get("responded_by_user") or {}
        by = user.get("name") or user.get("id") or f"nobody: no answer within {self.response_timeout}"
        at = answer.get("responded_at")
        decision = {"approved": approved, "decision": "approved" if approved else "rejected", "by": by,
                    "timed_out": bool(event.get("timedout")),
                    "at": at.isoformat() if hasattr(at, "isoformat") else at,
                    "model_name": self.model_name, "run_dir": evaluation.run_dir}
        if approved:
            self.log.info("APPROVED by %s: exporting %s from %s", by, self.model_name, evaluation.run_dir)
            return decision
        self.log.warning("REJECTED by %s: %s from %s is NOT exported; the run ends without a new version",
                         by, self.model_name, evaluation.run_dir)
        # Skipping the export ends this task by an exception (no return value): the decision is
        # pushed first, so the run's XCom says who rejected the model.
        context["ti"].xcom_push(key="return_value", value=decision)
        return super().execute_complete(context=context, event=event)
