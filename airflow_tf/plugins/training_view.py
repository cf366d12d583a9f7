"""The Training view: a page in the Airflow UI listing running and recent training groups across
DAGs (state, step/target, %, examples/s, loss, ETA, last update, failure reason, the tasks
replaced and why, links to the task log and TensorBoard), refreshing itself, mounted at
``/training`` behind Airflow's login.

Each row is what the launch and the wait recorded: the launch's XCom result (DAG, run, map index,
backend, group, run directory), the chief's ``progress.json`` in the run directory, the wait
task's state, its ``replacements`` XCom and, when it failed, its ``failure_reason`` XCom. A user
sees the groups of the DAGs they may read, by the same rule as TensorBoard (:mod:`.access`)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, JSONResponse

from airflow_tf.cluster.progress import check_progress_file

from .access import Launch, access_of, log_once, recorded_launches, signed_in_http_request
from .links import URL_PREFIX as TENSORBOARD_PREFIX
from .links import airflow_url, scalars_url, task_url

URL_PREFIX = "/training"
API_PATH = "/api/groups"
REFRESH_SECS = 3
RECENT_SECS = 7 * 24 * 3600
"""Finished groups stay listed this long after their launch."""
MAX_ROWS = 200

WAIT_OPERATOR = "WorkerCompletionSensor"
RUNNING_STATES = {"running", "deferred", "up_for_reschedule", "queued", "scheduled", "restarting", "up_for_retry"}
FAILED_STATES = {"failed", "upstream_failed"}


@dataclass(frozen=True)
class Wait:
    """The wait task watching a launch's group, as Airflow records it."""

    task_id: str
    state: str | None
    failure_reason: str | None = None
    replacements: tuple[str, ...] = ()
    """Each task restarted for a cause of its own, and why (``G-ps-0 restarted 1 time(s), last: ...``)."""


def _group_of(task_id: str) -> str:
    """The task group part of a task id (``training.launch`` -> ``training``)."""
    return task_id.rpartition(".")[0]


def read_progress(run_dir: str) -> dict[str, Any] | None:
    """The chief's report in ``run_dir`` as the view shows it: read without following a link,
    through :func:`~airflow_tf.cluster.progress.check_progress_file`; one that is not read is
    logged once and the row shows no progress."""
    try:
        return check_progress_file(run_dir)
    except ValueError as exc:
        # Once per run directory: a report rewritten every few seconds would log each version.
        log_once(("progress", run_dir), "the Training view shows no progress for %s: %s", run_dir, exc)
        return None


def training_rows(launches: Iterable[Launch], waits: dict[tuple[str, str, int], list[Wait]],
                  progress_of: Any = read_progress, now: float | None = None) -> list[dict[str, Any]]:
    """One row per launch, running groups first, then the most recently updated; ``waits`` holds
    the wait tasks of each (dag_id, run_id, map_index)."""
    now = time.time() if now is None else now
    rows: list[dict[str, Any]] = []
    for launch in launches:
        candidates = waits.get((launch.dag_id, launch.run_id, launch.map_index), [])
        wait = next((w for w in candidates if _group_of(w.task_id) == _group_of(launch.task_id)), None)
        progress = progress_of(launch.result.run_dir) or {}
        state = _state(wait, progress)
        updated = progress.get("time") or launch.recorded_at
        if state != "running" and now - launch.recorded_at > RECENT_SECS:
            continue
        name = launch.run_name
        rows.append({
            "dag_id": launch.dag_id,
            "run_id": launch.run_id,
            "map_index": launch.map_index,
            "group": launch.result.name,
            "backend": launch.result.group.get("backend"),
            "state": state,
            "global_step": progress.get("global_step"),
            "target_step": progress.get("target_step"),
            "percent": progress.get("percent"),
            "examples_per_sec": progress.get("examples_per_sec"),
            "loss": progress.get("loss"),
            "eta_seconds": None if progress.get("done") else progress.get("eta_seconds"),
            "last_update": updated,
            "failure_reason": wait.failure_reason if wait and state == "failed" else None,
            "replacements": list(wait.replacements) if wait else [],
            "log_url": task_url(launch.dag_id, launch.run_id, wait.task_id if wait else launch.task_id,
                                launch.map_index),
            "tensorboard_url": scalars_url([name], airflow_url() + TENSORBOARD_PREFIX) if name else None,
        })
    rows.sort(key=lambda row: (row["state"] != "running", -(row["last_update"] or 0)))
    return rows[:MAX_ROWS]


def _state(wait: Wait | None, progress: dict[str, Any]) -> str:
    """running, succeeded, failed, or what the wait task's state says; from the chief's report
    when no wait task watches the group."""
    if wait is None:
        return "succeeded" if progress.get("done") else "running"
    if wait.state in RUNNING_STATES or wait.state is None:
        return "running"
    if wait.state == "success":
        return "succeeded"
    if wait.state in FAILED_STATES:
        return "failed"
    return str(wait.state)


def _waits(launches: list[Launch]) -> dict[tuple[str, str, int], list[Wait]]:
    """The wait tasks in the DAG runs of ``launches`` and the failure reasons they recorded."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select, tuple_

    from airflow_tf.sensors.worker_completion import FAILURE_XCOM_KEY, REPLACEMENTS_XCOM_KEY

    runs = sorted({(launch.dag_id, launch.run_id) for launch in launches})
    if not runs:
        return {}
    found: dict[tuple[str, str, int], list[Wait]] = {}
    with create_session() as session:
        reasons, replaced = {}, {}
        for row in session.execute(
            select(XComModel.dag_id, XComModel.run_id, XComModel.task_id, XComModel.map_index, XComModel.key,
                   XComModel.value)
            .where(XComModel.key.in_((FAILURE_XCOM_KEY, REPLACEMENTS_XCOM_KEY)),
                   tuple_(XComModel.dag_id, XComModel.run_id).in_(runs))
        ).all():
            where = (row.dag_id, row.run_id, row.task_id, row.map_index)
            try:
                value = XComModel.deserialize_value(row)
            except Exception as exc:  # whatever a stored value makes its reading raise: that one is left out
                log_once(("wait", *where, row.key), "the Training view leaves out %s of %s: %s", row.key, where, exc)
                continue
            if row.key == FAILURE_XCOM_KEY:
                reasons[where] = value if isinstance(value, str) else None
            elif isinstance(value, list):
                replaced[where] = tuple(str(line) for line in value)
        for row in session.execute(
            select(TaskInstance.dag_id, TaskInstance.run_id, TaskInstance.task_id, TaskInstance.map_index,
                   TaskInstance.state)
            .where(TaskInstance.operator == WAIT_OPERATOR, tuple_(TaskInstance.dag_id, TaskInstance.run_id).in_(runs))
        ).all():
            where = (row.dag_id, row.run_id, row.task_id, row.map_index)
            state = None if row.state is None else str(getattr(row.state, "value", row.state))
            found.setdefault((row.dag_id, row.run_id, row.map_index), []).append(
                Wait(row.task_id, state, reasons.get(where), replaced.get(where, ())))
    return found


def readable_rows(user: Any) -> list[dict[str, Any]]:
    """The Training view's rows for ``user`` (blocking: database and file reads)."""
    access = access_of(user)
    launches = [launch for launch in recorded_launches() if access.may_read_dag(launch.dag_id)]
    return training_rows(launches, _waits(launches))


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Training</title>
<style>
  body { font-family: system-ui, sans-serif; margin: .75rem; font-size: 13px; color: #1f2937; }
  table { border-collapse: collapse; width: 100%; }
  th, td { border-bottom: 1px solid #e5e7eb; padding: .3rem .35rem; text-align: left; white-space: nowrap; }
  th { background: #f3f4f6; position: sticky; top: 0; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  td.run { white-space: normal; word-break: break-all; min-width: 10rem; max-width: 13rem; }
  td.reason { white-space: normal; max-width: 24rem; color: #b91c1c; }
  td.replaced { white-space: normal; max-width: 24rem; color: #92400e; }
  .scroll { overflow-x: auto; }
  .running { color: #1d4ed8; font-weight: 600; } .succeeded { color: #15803d; } .failed { color: #b91c1c; }
  progress { width: 3.5rem; vertical-align: middle; }
  #status { color: #6b7280; margin: .5rem 0; }
</style></head>
<body>
<h1 style="font-size: 1.25rem">Training groups</h1>
<div id="status">loading…</div>
<div class="scroll"><table><thead><tr>
  <th>DAG</th><th>Run</th><th>Map</th><th>Backend</th><th>State</th><th>Step / target</th><th>%</th>
  <th>Examples/s</th><th>Loss</th><th>ETA</th><th>Last update</th><th>Failure reason</th><th>Replaced</th>
  <th>Links</th>
</tr></thead><tbody id="groups"></tbody></table></div>
<script>
const API = __API__, EVERY = __EVERY__ * 1000;
function cell(row, text, cls) {
  const td = row.insertCell(); td.textContent = text == null ? "" : String(text); if (cls) td.className = cls; return td;
}
function num(value, digits) { return value == null ? "" : Number(value).toFixed(digits); }
function ago(seconds) {
  if (seconds == null) return "";
  const s = Math.max(0, Math.round(Date.now() / 1000 - seconds));
  return s < 60 ? s + " s ago" : s < 3600 ? Math.round(s / 60) + " min ago" : new Date(seconds * 1000).toLocaleString();
}
function duration(s) { return s == null ? "" : s < 60 ? Math.round(s) + " s" : Math.round(s / 60) + " min"; }
function link(td, href, text) {
  if (!href) return; const a = document.createElement("a"); a.href = href; a.target = "_top"; a.textContent = text;
  if (td.childNodes.length) td.append(" · "); td.append(a);
}
async function refresh() {
  const status = document.getElementById("status");
  try {
    const response = await fetch(API, {credentials: "same-origin", cache: "no-store"});
    if (!response.ok) { status.textContent = "cannot load: HTTP " + response.status; return; }
    const groups = (await response.json()).groups, body = document.getElementById("groups");
    body.replaceChildren();
    for (const g of groups) {
      const row = body.insertRow(); row.dataset.group = g.group; row.dataset.state = g.state;
      cell(row, g.dag_id); cell(row, g.run_id, "run"); cell(row, g.map_index >= 0 ? g.map_index : ""); cell(row, g.backend);
      cell(row, g.state, g.state);
      cell(row, g.global_step == null ? "" : g.global_step + " / " + g.target_step, "num step");
      const pct = cell(row, "", "num");
      if (g.percent != null) { const bar = document.createElement("progress"); bar.max = 100; bar.value = g.percent;
        pct.append(bar, " " + num(g.percent, 1)); }
      cell(row, num(g.examples_per_sec, 0), "num"); cell(row, g.loss == null ? "" : Number(g.loss).toPrecision(4), "num");
      cell(row, duration(g.eta_seconds), "num"); cell(row, ago(g.last_update)); cell(row, g.failure_reason, "reason");
      cell(row, g.replacements.join("; "), "replaced");
      const links = cell(row, ""); link(links, g.log_url, "Task log"); link(links, g.tensorboard_url, "TensorBoard");
    }
    status.textContent = groups.length + " group(s); refreshed " + new Date().toLocaleTimeString()
      + ", every " + (EVERY / 1000) + " s";
  } catch (error) { status.textContent = "cannot load: " + error; }
}
refresh(); setInterval(refresh, EVERY);
</script>
</body></html>
"""


class TrainingViewApp:
    """The ASGI app mounted at ``/training``: the page, and its data at ``/training/api/groups``."""

    async def __call__(self, scope, receive, send) -> None:
        signed_in = await signed_in_http_request(scope, receive, send)
        if signed_in is None:
            return
        _, user = signed_in
        root = scope.get("root_path", "").rstrip("/")
        path = scope["path"].removeprefix(root)
        if path == API_PATH:
            rows = await run_in_threadpool(readable_rows, user)
            response: Any = JSONResponse({"groups": rows}, headers={"Cache-Control": "no-store"})
        elif path in ("", "/"):
            page = PAGE.replace("__API__", json.dumps(root + API_PATH).replace("<", "\\u003c"))
            response = HTMLResponse(page.replace("__EVERY__", str(REFRESH_SECS)))
        else:
            response = JSONResponse({"detail": "Not Found"}, status_code=404)
        await response(scope, receive, send)
