"""Drives the plugin's mounted app (TensorBoardApp, or the one at --mount) with Starlette's TestClient inside an Airflow
home given by the environment (token checks read the metadata database), as a separate process
so that this Airflow configuration is the one loaded.

    python mounted_app.py '<requests as JSON>' [--without-tensorboard] [--mount=/training]

Each request: {"path", "params", "auth": null | "bad" | <role>, "via": "header" | "cookie"};
prints one JSON list of {"status", "body"} (the body parsed as JSON when it is JSON)."""

from __future__ import annotations

import json
import sys

from starlette.testclient import TestClient

if "--without-tensorboard" in sys.argv:
    # Simulates a deployment without the package: importing tensorboard raises ImportError.
    sys.modules["tensorboard"] = None  # type: ignore[assignment]

from airflow.api_fastapi.app import create_auth_manager  # noqa: E402
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser  # noqa: E402

from airflow_tf.plugins.tensorboard import TensorBoardPlugin  # noqa: E402

manager = create_auth_manager()
prefix = next((arg.split("=", 1)[1] for arg in sys.argv if arg.startswith("--mount=")), "/tensorboard")
[mount] = [app for app in TensorBoardPlugin.fastapi_apps if app["url_prefix"] == prefix]
answers = []
with TestClient(mount["app"], base_url=f"http://airflow{prefix}", root_path=prefix,
                follow_redirects=False) as client:
    for request in json.loads(sys.argv[1]):
        auth, headers = request.get("auth"), {}
        client.cookies.clear()
        if auth:
            token = "not-a-jwt" if auth == "bad" else manager.generate_jwt(SimpleAuthManagerUser(username="alice", role=auth))
            if request.get("via", "header") == "cookie":
                client.cookies.set("_token", token)  # the UI's session cookie
            else:
                headers["Authorization"] = f"Bearer {token}"
        response = client.get(request["path"], params=request.get("params"), headers=headers)
        try:
            body = response.json()
        except ValueError:
            body = response.text
        answers.append({"status": response.status_code, "body": body, "location": response.headers.get("location")})
print(json.dumps(answers))
