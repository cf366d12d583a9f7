"""Who may see which training run: the one rule behind the TensorBoard mount and the Training view.

A training run belongs to the DAG run whose launch created it. Two records must agree: the
launch's XCom result (``LaunchResult``: run directory, group, map index), which Airflow stores
under the task that returned it, and the run directory's own launch record, which only the launch
writes (:func:`airflow_tf.backends.ownership.claim_run_dir`). Any task can return a value shaped
like a launch result; one whose run directory does not name that task as its launch is ignored
(and logged), so a DAG cannot claim another DAG's run or a directory inside it. A user may see a run when the auth manager lets them read every DAG that recorded it
(``get_authorized_dag_ids``, which asks per team where Airflow runs in multi-team mode). A run no
launch recorded (e.g. ``airflow-tf run`` without Airflow, or a DAG run since deleted) is shown only
to users who may read every DAG Airflow knows."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from airflow_tf.backends.ownership import RunLaunch, run_launch
from airflow_tf.cluster.results import LaunchResult
from airflow_tf.files import UnsafePathError, open_beneath

from .links import run_name, run_roots, split_run_name

log = logging.getLogger(__name__)

RECORDS_TTL_SECS = 5.0
"""How long the launches read from XCom are reused: TensorBoard's page sends many requests at once."""


@dataclass(frozen=True)
class Launch:
    """One launch task's recorded result, and where Airflow keeps it."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    result: LaunchResult
    recorded_at: float
    """When the launch pushed its result (seconds since the epoch)."""

    @property
    def run_name(self) -> str | None:
        """The run's TensorBoard name, or None when its run directory is outside ``<storage>/runs/``."""
        return run_name(self.result.run_dir)


def _is_launch_result(value: Any) -> bool:
    return isinstance(value, dict) and {"group", "run_dir", "training", "dataset"} <= value.keys()


def _read_launches() -> list[Launch]:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    launches = []
    with create_session() as session:
        rows = session.execute(
            select(XComModel.dag_id, XComModel.run_id, XComModel.task_id, XComModel.map_index,
                   XComModel.timestamp, XComModel.value).where(XComModel.key == "return_value")
        ).all()
        for row in rows:
            # Any task can return anything: one malformed result is logged and skipped, and
            # never keeps the others from being shown.
            try:
                launch = _launch_of(row, XComModel.deserialize_value(row))
            except Exception as exc:  # whatever a stored value makes its reading raise
                log_once(("unreadable", row.dag_id, row.run_id, row.task_id, row.map_index),
                          "ignoring the result returned by %s/%s/%s[%s]: %s", row.dag_id, row.run_id, row.task_id,
                          row.map_index, exc)
                continue
            if launch is not None and _launched_it(launch):
                launches.append(launch)
    return launches


def _launch_of(row: Any, value: Any) -> Launch | None:
    """The launch an XCom row holds; None for a value not shaped like a launch's result; a
    ValueError naming the field for one shaped like it with a field of the wrong type."""
    if not _is_launch_result(value):
        return None
    return Launch(row.dag_id, row.run_id, row.task_id, int(row.map_index), LaunchResult.from_dict(value),
                  row.timestamp.timestamp() if row.timestamp else 0.0)


_IGNORED: OrderedDict[tuple, None] = OrderedDict()
"""The claims already logged as ignored (the launches are read again every few seconds), the
newest ``IGNORED_REMEMBERED``: a flood of forged results cannot grow the API server's memory."""
IGNORED_REMEMBERED = 10_000


def _launched_it(launch: Launch) -> bool:
    """Whether the run directory's own record names this task instance as its launch."""
    claimant = RunLaunch(launch.dag_id, launch.run_id, launch.task_id, launch.map_index)
    try:
        recorded: RunLaunch | None = run_launch(launch.result.run_dir)
    except ValueError as exc:  # a path or record that cannot be trusted: no launch shown from it
        _log_ignored(launch, str(exc))
        return False
    if recorded == claimant:
        return True
    _log_ignored(launch, f"its run directory {launch.result.run_dir} records {recorded or 'no launch'} as its "
                         f"launch")
    return False


def _log_ignored(launch: Launch, why: str) -> None:
    """Logs once (of the last IGNORED_REMEMBERED) that a launch result is not shown as its DAG's run."""
    claimant = RunLaunch(launch.dag_id, launch.run_id, launch.task_id, launch.map_index)
    log_once((launch.dag_id, launch.run_id, launch.task_id, launch.map_index, repr(launch.result.run_dir)),
              "ignoring the launch result returned by %s: %s, so the run is not shown as %s's", claimant, why,
              launch.dag_id)


def log_once(key: tuple, message: str, *args: Any) -> None:
    """Logs a warning the first time ``key`` is seen (of the last IGNORED_REMEMBERED): the
    records are read again every few seconds."""
    if key not in _IGNORED:
        _IGNORED[key] = None
        if len(_IGNORED) > IGNORED_REMEMBERED:
            _IGNORED.popitem(last=False)
        log.warning(message, *args)


def _dag_teams() -> dict[str, str]:
    """Each DAG's team (through its bundle), for DAGs whose bundle has one."""
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.team import Team
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(DagModel.dag_id, Team.name)
            .join(DagBundleModel, DagModel.bundle_name == DagBundleModel.name)
            .join(DagBundleModel.teams)
        ).all()
    return {dag_id: team for dag_id, team in rows}


def _in_own_team(launches: list[Launch], roots: dict[str, str]) -> list[Launch]:
    """With teams, the launches whose run lies in their own DAG's team's root: a DAG of one team
    cannot claim a run found in another team's root, whatever either root holds."""
    if "" in roots:
        return launches
    dag_teams = _dag_teams()
    kept = []
    for launch in launches:
        name = run_name(launch.result.run_dir, roots)
        team = name.partition("/")[0] if name else None
        if team is not None and team == dag_teams.get(launch.dag_id):
            kept.append(launch)
        else:
            _log_ignored(launch, f"its run directory {launch.result.run_dir} is not in the storage root of "
                                 f"{launch.dag_id}'s team ({dag_teams.get(launch.dag_id) or 'none'})")
    return kept


class _Records:
    """The launches recorded in XCom (with teams, each in its own team's root), read at most every
    RECORDS_TTL_SECS seconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._launches: list[Launch] = []

    def launches(self) -> list[Launch]:
        with self._lock:
            if time.monotonic() - self._read_at > RECORDS_TTL_SECS:
                self._launches = _in_own_team(_read_launches(), run_roots())
                self._read_at = time.monotonic()
            return self._launches


RECORDS = _Records()


def recorded_launches() -> list[Launch]:
    return RECORDS.launches()


def run_owners(launches: Iterable[Launch]) -> dict[str, set[str]]:
    """TensorBoard run name -> the DAG ids whose launches recorded it."""
    owners: dict[str, set[str]] = {}
    for launch in launches:
        if name := launch.run_name:
            owners.setdefault(name, set()).add(launch.dag_id)
    return owners


@dataclass(frozen=True)
class Access:
    """What one signed-in user may read, decided once per request."""

    dag_ids: frozenset[str]
    """The DAGs the auth manager lets the user read."""
    every_dag: bool
    """True when those are all the DAGs Airflow knows (the user may read unrecorded runs too)."""
    owners: dict[str, set[str]]
    roots: dict[str, str]
    """The directories TensorBoard's run names are relative to, by their prefix (:func:`.links.run_roots`)."""

    def may_read_dag(self, dag_id: str) -> bool:
        return dag_id in self.dag_ids

    def may_read_run(self, name: str) -> bool:
        """Whether TensorBoard run ``name`` (a run directory below a root, or a directory inside
        one, e.g. ``<group>/eval``; with teams, after its team's prefix) may be shown."""
        found = split_run_name(name, self.roots)
        if found is None:
            return False
        prefix, relative = found
        runs, parts = self.roots[prefix], relative.strip("/").split("/")
        for end in range(len(parts), 0, -1):
            owner = "/".join(parts[:end])
            owners = self.owners.get(f"{prefix}/{owner}" if prefix else owner)
            if owners is not None:
                return owners <= self.dag_ids and stays_inside(runs, relative)
        return self.every_dag and stays_inside(runs, relative)


def stays_inside(runs: str, name: str) -> bool:
    """Whether run ``name``'s directory is reached from ``runs`` without a symbolic link or
    ``..``, so inside the run that owns it (whichever prefix of ``name`` that is). The event files themselves are checked when TensorBoard opens them (the same
    :func:`airflow_tf.files.open_beneath`): a link out of a run never serves another run's
    files under this run's name; this only keeps such a name out of the listings."""
    relative = "" if name.strip("/") == "." else name  # TensorBoard's name for runs/ itself
    try:
        os.close(open_beneath(runs, relative, directory=True))
    except UnsafePathError:
        return False
    except OSError:  # gone or unreadable: nothing of it can be served either
        return True
    return True


def _all_dag_ids() -> set[str]:
    """Every DAG the auth manager is asked about (``get_authorized_dag_ids`` asks about these)."""
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        query = select(DagModel.dag_id).join(DagBundleModel, DagModel.bundle_name == DagBundleModel.name)
        return set(session.scalars(query).all())


def access_of(user: Any) -> Access:
    """The user's :class:`Access`, from the auth manager's own answer (blocking: database reads)."""
    from airflow.api_fastapi.app import get_auth_manager

    dag_ids = frozenset(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))
    return Access(dag_ids, _all_dag_ids() <= dag_ids, run_owners(recorded_launches()), run_roots())


async def signed_in_user(request: Request) -> Any:
    """The signed-in user, as Airflow's API finds it: the JWT in ``Authorization: Bearer`` or the
    UI's ``_token`` cookie; 401 without a token, 401/403 for an expired or invalid one."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.core_api.security import resolve_user_from_token

    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    token = credentials.strip() if scheme.lower() == "bearer" else request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    return await resolve_user_from_token(token)


__all__ = ["Access", "Launch", "access_of", "recorded_launches", "run_owners", "signed_in_user"]


async def signed_in_http_request(scope, receive, send) -> tuple[Request, Any] | None:
    """For a mounted ASGI app: the HTTP request and its signed-in user; None when this has
    already answered (lifespan events of an app run on its own, a websocket refused, or the
    sign-in's 401/403)."""
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse

    if scope["type"] == "lifespan":  # when run on its own; nothing to start or stop
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return None
    if scope["type"] != "http":  # the views serve plain HTTP only
        await send({"type": "websocket.close", "code": 1008})
        return None
    request = Request(scope, receive)
    try:
        return request, await signed_in_user(request)
    except HTTPException as exc:
        await JSONResponse({"detail": exc.detail}, status_code=exc.status_code)(scope, receive, send)
        return None
