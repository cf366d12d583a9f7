"""TensorBoard in the Airflow API server: the plugin, and the ASGI app it mounts at ``/tensorboard``.

A mounted app is not behind Airflow's login by itself, so :class:`TensorBoardApp` checks every
request the way Airflow's own API does (the JWT in ``Authorization: Bearer`` or the UI's
``_token`` cookie, through the auth manager) and asks the auth manager whether the user may
read DAG runs: TensorBoard shows the runs of every DAG. TensorBoard itself is built on the first
authorised request (the API server starts fast, and works without ``tensorboard`` installed:
then the mount answers how to enable it)."""

from __future__ import annotations

import html
import logging
import threading
from typing import Any, Callable

from airflow.plugins_manager import AirflowPlugin
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse

from airflow_tf.cluster.results import LaunchResult
from airflow_tf.storage import runs_dir

from .links import URL_PREFIX, TensorBoardLink, run_name, scalars_url

log = logging.getLogger(__name__)

DAG_RUN_VIEW = "/airflow/dag-run"
"""Inside the mount: redirects to the curves of one DAG run's launches (the DAG-run view)."""
RELOAD_INTERVAL_SECS = 5

NOT_INSTALLED = """<!doctype html>
<html><head><title>TensorBoard is not installed</title></head>
<body style="font-family: sans-serif; max-width: 48em; margin: 2em auto">
<h1>TensorBoard is not installed</h1>
<p>The training runs' summaries are in <code>{runs}</code>, but the Airflow API server cannot
show them: the <code>tensorboard</code> package is missing ({error}).</p>
<p>Install it where the API server runs, then restart the API server:</p>
<pre>pip install "airflow-tf[tensorboard]"</pre>
</body></html>
"""


def build_tensorboard(logdir: str) -> Callable:
    """TensorBoard's WSGI app over ``logdir`` (imports TensorBoard: call it when first needed)."""
    from tensorboard import program
    from tensorboard.backend import application
    from tensorboard.backend.event_processing import data_ingester

    board = program.TensorBoard()
    # path_prefix "": the mount's prefix reaches TensorBoard as SCRIPT_NAME. load_fast false:
    # read event files in this process instead of starting TensorBoard's data-server binary.
    board.configure(logdir=logdir, path_prefix="", load_fast="false", reload_interval=RELOAD_INTERVAL_SECS)
    ingester = data_ingester.LocalDataIngester(board.flags)
    ingester.start()
    return application.TensorBoardWSGIApp(
        board.flags, board.plugin_loaders, ingester.data_provider, board.assets_zip_provider,
        ingester.deprecated_multiplexer,
    )


async def authorized_user(request: Request) -> Any:
    """The signed-in user, as Airflow's API finds it; 401/403 without a valid token or read access
    to DAG runs."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.core_api.security import resolve_user_from_token

    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    token = credentials.strip() if scheme.lower() == "bearer" else request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    user = await resolve_user_from_token(token)
    if not get_auth_manager().is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN, user=user):
        raise HTTPException(status_code=403, detail="Forbidden: TensorBoard needs read access to DAG runs")
    return user


def launch_runs(dag_id: str, run_id: str) -> list[str]:
    """TensorBoard run names of the launches in one DAG run (their XCom results), sorted."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    names = set()
    with create_session() as session:
        rows = session.execute(
            select(XComModel.value).where(
                XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.key == "return_value"
            )
        ).all()
        for row in rows:
            value = XComModel.deserialize_value(row)
            if isinstance(value, dict) and {"group", "run_dir", "training"} <= value.keys():
                if name := run_name(LaunchResult.from_dict(value).run_dir):
                    names.add(name)
    return sorted(names)


class TensorBoardApp:
    """The ASGI app mounted at ``/tensorboard``: authentication, the DAG-run view, then TensorBoard
    (a2wsgi's WSGIMiddleware around TensorBoard's WSGI app, built on first use)."""

    def __init__(self, factory: Callable[[str], Callable] = build_tensorboard) -> None:
        self._factory = factory
        self._app: Any = None
        self._lock = threading.Lock()

    def _tensorboard(self) -> Any:
        with self._lock:
            if self._app is None:
                from a2wsgi import WSGIMiddleware

                runs = runs_dir()  # the storage as configured when TensorBoard is first asked for
                try:
                    self._app = WSGIMiddleware(self._factory(runs))
                    log.info("TensorBoard serves %s", runs)
                except ImportError as exc:
                    log.warning("TensorBoard is not installed (%s): pip install \"airflow-tf[tensorboard]\"", exc)
                    page = NOT_INSTALLED.format(runs=html.escape(runs), error=html.escape(str(exc)))
                    self._app = HTMLResponse(page, status_code=503)
            return self._app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":  # when run on its own; nothing to start or stop
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":  # TensorBoard serves plain HTTP only
            await send({"type": "websocket.close", "code": 1008})
            return
        request = Request(scope, receive)
        try:
            await authorized_user(request)
        except HTTPException as exc:
            await JSONResponse({"detail": exc.detail}, status_code=exc.status_code)(scope, receive, send)
            return
        if scope["path"].removeprefix(scope.get("root_path", "")) == DAG_RUN_VIEW:
            dag_id, run_id = request.query_params.get("dag_id"), request.query_params.get("run_id")
            if not dag_id or not run_id:
                await JSONResponse({"detail": "dag_id and run_id are required"}, status_code=400)(scope, receive, send)
                return
            names = await run_in_threadpool(launch_runs, dag_id, run_id)
            target = scalars_url(names, scope.get("root_path", "").rstrip("/"))
            await RedirectResponse(target, status_code=307)(scope, receive, send)
            return
        app = await run_in_threadpool(self._tensorboard)
        await app(scope, receive, send)


class TensorBoardPlugin(AirflowPlugin):
    """Registered through the ``airflow.plugins`` entry point of the airflow-tf distribution."""

    name = "airflow_tf"
    fastapi_apps = [{"app": TensorBoardApp(), "url_prefix": URL_PREFIX, "name": "TensorBoard"}]
    external_views = [
        {
            "name": "TensorBoard",
            # The UI fills in {DAG_ID} and {RUN_ID} for views on a DAG run.
            "href": f"{URL_PREFIX}{DAG_RUN_VIEW}?dag_id={{DAG_ID}}&run_id={{RUN_ID}}",
            "destination": "dag_run",
            "url_route": "tensorboard",
        }
    ]
    operator_extra_links = [TensorBoardLink()]
