"""TensorBoard in the Airflow API server: the plugin, and the ASGI app it mounts at ``/tensorboard``.

A mounted app is not behind Airflow's login by itself, so :class:`TensorBoardApp` checks every
request the way Airflow's own API does (the JWT in ``Authorization: Bearer`` or the UI's
``_token`` cookie, through the auth manager) and then serves only the runs of the DAGs the user
may read (:mod:`.access`): TensorBoard's plugins read their data through a data provider, and
the one given to them (:class:`ReadableRunsProvider`) answers for the request's readable runs
only, so the runs list, every data endpoint and every page see the same filtered logdir. A run
the user may not read is not found, exactly like a run that does not exist; so is a run reached
through a symbolic link, and TensorBoard reads each event file as it opened it, below its run
with no link followed and no hard link (:mod:`.run_files`). Neither ``/data/logdir`` nor
``/data/environment`` tells where the storage is. TensorBoard itself
is built on the first authorised request (the API server starts fast, and works without
``tensorboard`` installed: then the mount answers how to enable it)."""

from __future__ import annotations

import base64
import contextvars
import html
import json
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from airflow.plugins_manager import AirflowPlugin
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse

from .access import Access, access_of, recorded_launches, signed_in_http_request
from .links import URL_PREFIX, TensorBoardLink, run_roots, scalars_url
from .training_view import URL_PREFIX as TRAINING_PREFIX
from .training_view import TrainingViewApp

log = logging.getLogger(__name__)

HIDDEN_LOGDIR = re.compile(r"(^|/)data/logdir$")
"""TensorBoard's core endpoint that answers its logdir (the storage's path): answered empty here."""
DAG_RUN_VIEW = "/airflow/dag-run"
"""Inside the mount: redirects to the curves of one DAG run's launches (the DAG-run view)."""
RELOAD_INTERVAL_SECS = 5

# TensorBoard's plugins that read their data through the data provider only, and so see only the
# readable runs. Left out: debugger-v2 and the projector read the logdir themselves; the profile
# and what-if redirects show nothing of a run.
PLUGINS = ("core", "timeseries", "scalars", "custom_scalars", "images", "audio", "graphs", "distributions",
           "histograms", "text", "pr_curves", "hparams", "mesh")

READABLE: contextvars.ContextVar[Access | None] = contextvars.ContextVar("airflow_tf_readable", default=None)
"""The current request's :class:`Access` (a2wsgi runs TensorBoard in a copy of the request's context)."""

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


def _readable(run: str) -> bool:
    access = READABLE.get()
    return access is not None and access.may_read_run(run)  # no request's access: nothing


class _ReadableRuns:
    """The methods of :class:`ReadableRunsProvider`, kept out of the function that builds it: TensorBoard's
    ``DataProvider`` base class is imported only when TensorBoard is built."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def _filter(self, ctx: Any, experiment_id: str, run_tag_filter: Any) -> Any:
        from tensorboard.data import provider

        wanted = run_tag_filter.runs if run_tag_filter is not None else None
        if wanted is None:
            wanted = [run.run_name for run in self._inner.list_runs(ctx, experiment_id=experiment_id)]
        tags = run_tag_filter.tags if run_tag_filter is not None else None
        return provider.RunTagFilter(runs=[run for run in wanted if _readable(run)], tags=tags)

    def _only_readable(self, result: dict) -> dict:
        return {run: tags for run, tags in result.items() if _readable(run)}

    def experiment_metadata(self, ctx=None, *, experiment_id):
        # Without data_location: the storage's path is not the viewers' to know (/data/environment).
        from tensorboard.data import provider

        found = self._inner.experiment_metadata(ctx, experiment_id=experiment_id)
        return provider.ExperimentMetadata(experiment_name=found.experiment_name,
                                           experiment_description=found.experiment_description,
                                           creation_time=found.creation_time)

    def list_plugins(self, ctx=None, *, experiment_id):
        return self._inner.list_plugins(ctx, experiment_id=experiment_id)

    def list_runs(self, ctx=None, *, experiment_id):
        return [run for run in self._inner.list_runs(ctx, experiment_id=experiment_id) if _readable(run.run_name)]

    def _listing(self, method: str, ctx: Any, experiment_id: str, plugin_name: str, run_tag_filter: Any) -> dict:
        narrowed = self._filter(ctx, experiment_id, run_tag_filter)
        if not narrowed.runs:
            return {}
        found = getattr(self._inner, method)(ctx, experiment_id=experiment_id, plugin_name=plugin_name,
                                       run_tag_filter=narrowed)
        return self._only_readable(found)

    def list_scalars(self, ctx=None, *, experiment_id, plugin_name, run_tag_filter=None):
        return self._listing("list_scalars", ctx, experiment_id, plugin_name, run_tag_filter)

    def list_tensors(self, ctx=None, *, experiment_id, plugin_name, run_tag_filter=None):
        return self._listing("list_tensors", ctx, experiment_id, plugin_name, run_tag_filter)

    def list_blob_sequences(self, ctx=None, *, experiment_id, plugin_name, run_tag_filter=None):
        return self._listing("list_blob_sequences", ctx, experiment_id, plugin_name, run_tag_filter)

    def read_last_scalars(self, ctx=None, *, experiment_id, plugin_name, run_tag_filter=None):
        return self._listing("read_last_scalars", ctx, experiment_id, plugin_name, run_tag_filter)

    def _read(self, method: str, ctx: Any, *, experiment_id: str, plugin_name: str, downsample: Any,
              run_tag_filter: Any) -> dict:
        narrowed = self._filter(ctx, experiment_id, run_tag_filter)
        if not narrowed.runs:
            return {}
        found = getattr(self._inner, method)(ctx, experiment_id=experiment_id, plugin_name=plugin_name,
                                       downsample=downsample, run_tag_filter=narrowed)
        return self._only_readable(found)

    def read_scalars(self, ctx=None, *, experiment_id, plugin_name, downsample=None, run_tag_filter=None):
        return self._read("read_scalars", ctx, experiment_id=experiment_id, plugin_name=plugin_name,
                          downsample=downsample, run_tag_filter=run_tag_filter)

    def read_tensors(self, ctx=None, *, experiment_id, plugin_name, downsample=None, run_tag_filter=None):
        return self._read("read_tensors", ctx, experiment_id=experiment_id, plugin_name=plugin_name,
                          downsample=downsample, run_tag_filter=run_tag_filter)

    def read_blob_sequences(self, ctx=None, *, experiment_id, plugin_name, downsample=None, run_tag_filter=None):
        return self._read("read_blob_sequences", ctx, experiment_id=experiment_id, plugin_name=plugin_name,
                          downsample=downsample, run_tag_filter=run_tag_filter)

    def read_blob(self, ctx=None, *, blob_key):
        from tensorboard import errors

        # The local provider's blob key is URL-safe base64 of a JSON list whose third item is
        # the run; a key that does not decode so names no run anyone may read.
        try:
            run = json.loads(base64.urlsafe_b64decode(blob_key + "=="))[2]
        except (ValueError, TypeError, IndexError, KeyError):
            raise errors.NotFoundError(f"blob {blob_key!r}") from None
        if not isinstance(run, str) or not _readable(run):
            raise errors.NotFoundError(f"blob {blob_key!r}")
        return self._inner.read_blob(ctx, blob_key=blob_key)

    # Hyperparameters come from tensors (listed above, filtered); the experiment-level
    # answers of these two would cover every run, so they stay empty.
    def list_hyperparameters(self, ctx=None, *, experiment_ids, limit=None):
        from tensorboard.data import provider

        return provider.ListHyperparametersResult(hyperparameters=[], session_groups=[])

    def read_hyperparameters(self, ctx=None, *, experiment_ids, filters=None, sort=None,
                             hparams_to_include=None):
        return []


def readable_runs_provider(inner: Any) -> Any:
    """``inner`` (TensorBoard's data provider over the whole logdir) seen through the current
    request's :data:`READABLE` access: listings leave out the other runs, reads of them find nothing."""
    from tensorboard.data import provider

    class ReadableRunsProvider(_ReadableRuns, provider.DataProvider):
        pass

    return ReadableRunsProvider(inner)


def build_tensorboard(roots: dict[str, str]) -> Callable:
    """TensorBoard's WSGI app over ``roots`` (:func:`.links.run_roots`: one runs directory, or
    each team's under its name), each request seeing only its readable runs (imports
    TensorBoard: call it when first needed)."""
    from tensorboard import default, program
    from tensorboard.backend import application

    from tensorboard.plugins.core import core_plugin

    from .run_files import checked_data_provider

    # The core plugin without its debug information: that lists the flags, logdir included.
    plugins = [core_plugin.CorePluginLoader(include_debug_info=False) if _plugin_name(p) == "core" else p
               for p in default.get_plugins() if _plugin_name(p) in PLUGINS]
    board = program.TensorBoard(plugins=plugins)
    # path_prefix "": the mount's prefix reaches TensorBoard as SCRIPT_NAME. load_fast false:
    # read event files in this process instead of starting TensorBoard's data-server binary.
    logdir = ({"logdir": roots[""]} if "" in roots
              else {"logdir_spec": ",".join(f"{prefix}:{runs}" for prefix, runs in sorted(roots.items()))})
    board.configure(**logdir, path_prefix="", load_fast="false", reload_interval=RELOAD_INTERVAL_SECS)
    # TensorBoard's ingester, but each event file opened without following a link (.run_files).
    provider = checked_data_provider(board.flags, roots, RELOAD_INTERVAL_SECS)
    # No multiplexer for the plugins: what reads it directly would bypass the filter.
    return application.TensorBoardWSGIApp(
        board.flags, board.plugin_loaders, readable_runs_provider(provider), board.assets_zip_provider, None,
    )


def _plugin_name(plugin: Any) -> str | None:
    """The name a TensorBoard plugin (class or loader) serves under."""
    from tensorboard.plugins.core import core_plugin

    if isinstance(plugin, core_plugin.CorePluginLoader):
        return "core"
    return getattr(plugin, "plugin_name", None)


def launch_runs(dag_id: str, run_id: str) -> list[str]:
    """TensorBoard run names of the launches in one DAG run (their XCom results), sorted."""
    return sorted({launch.run_name for launch in recorded_launches()
                   if launch.dag_id == dag_id and launch.run_id == run_id and launch.run_name})


class TensorBoardApp:
    """The ASGI app mounted at ``/tensorboard``: authentication, the user's readable runs, the
    DAG-run view, then TensorBoard (a2wsgi's WSGIMiddleware around TensorBoard's WSGI app, built
    on first use)."""

    def __init__(self, factory: Callable[[dict[str, str]], Callable] = build_tensorboard) -> None:
        self._factory = factory
        self._app: Any = None
        self._lock = threading.Lock()

    def _tensorboard(self) -> Any:
        with self._lock:
            if self._app is None:
                from a2wsgi import WSGIMiddleware

                roots = run_roots()  # the storage as configured when TensorBoard is first asked for
                runs = ", ".join(roots.values())
                try:
                    self._app = WSGIMiddleware(self._factory(roots))
                    log.info("TensorBoard serves %s", runs)
                except ImportError as exc:
                    log.warning("TensorBoard is not installed (%s): pip install \"airflow-tf[tensorboard]\"", exc)
                    page = NOT_INSTALLED.format(runs=html.escape(runs), error=html.escape(str(exc)))
                    self._app = HTMLResponse(page, status_code=503)
            return self._app

    async def __call__(self, scope, receive, send) -> None:
        signed_in = await signed_in_http_request(scope, receive, send)
        if signed_in is None:
            return
        request, user = signed_in
        if scope["path"].removeprefix(scope.get("root_path", "")) == DAG_RUN_VIEW:
            dag_id, run_id = request.query_params.get("dag_id"), request.query_params.get("run_id")
            if not dag_id or not run_id:
                await JSONResponse({"detail": "dag_id and run_id are required"}, status_code=400)(scope, receive, send)
                return
            access = await run_in_threadpool(access_of, user)
            if not access.may_read_dag(dag_id):  # the same answer as for a DAG that does not exist
                await JSONResponse({"detail": "DAG run not found"}, status_code=404)(scope, receive, send)
                return
            names = await run_in_threadpool(launch_runs, dag_id, run_id)
            target = scalars_url(names, scope.get("root_path", "").rstrip("/"))
            await RedirectResponse(target, status_code=307)(scope, receive, send)
            return
        if HIDDEN_LOGDIR.search(scope["path"]):
            await JSONResponse({"logdir": ""})(scope, receive, send)
            return
        app = await run_in_threadpool(self._tensorboard)
        # Only TensorBoard's data endpoints (``/data/...``, ``/experiment/<id>/data/...``) read
        # runs; its pages and scripts need no database reads. A request without READABLE set
        # sees no run at all, so skipping the lookup can hide runs but never show one.
        readable = await run_in_threadpool(access_of, user) if "/data/" in scope["path"] else None
        token = READABLE.set(readable)
        try:
            await app(scope, receive, send)
        finally:
            READABLE.reset(token)


class TensorBoardPlugin(AirflowPlugin):
    """Registered through the ``airflow.plugins`` entry point of the airflow-tf distribution."""

    name = "airflow_tf"
    fastapi_apps: list[Any] = [  # noqa: RUF012  as AirflowPlugin declares it (not ClassVar)
        {"app": TensorBoardApp(), "url_prefix": URL_PREFIX, "name": "TensorBoard"},
        {"app": TrainingViewApp(), "url_prefix": TRAINING_PREFIX, "name": "Training"},
    ]
    external_views: list[Any] = [  # noqa: RUF012  as AirflowPlugin declares it (not ClassVar)
        {
            # In the UI's navigation: the training groups of every DAG the user may read.
            "name": "Training",
            "href": f"{TRAINING_PREFIX}/",
            "destination": "nav",
            "url_route": "training",
        },
        {
            "name": "TensorBoard",
            # The UI fills in {DAG_ID} and {RUN_ID} for views on a DAG run.
            "href": f"{URL_PREFIX}{DAG_RUN_VIEW}?dag_id={{DAG_ID}}&run_id={{RUN_ID}}",
            "destination": "dag_run",
            "url_route": "tensorboard",
        }
    ]
    operator_extra_links: list[Any] = [TensorBoardLink()]  # noqa: RUF012  as AirflowPlugin declares it (not ClassVar)
