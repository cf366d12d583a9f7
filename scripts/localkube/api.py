"""The few calls the tooling makes to the plane's API server (the standard library's HTTPS: no
Kubernetes client is installed before any environment exists), and the controllers' health probes."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

Json = dict[str, Any]
"""A JSON object as the API server sends it (its shape is the API's, checked where it is read)."""


def api_get(server: str, ca: Path, token: str, path: str) -> Json | None:
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(server + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as response:
            body = response.read()
    except (urllib.error.URLError, OSError):
        return None
    try:
        return json.loads(body)
    except ValueError:
        return {"text": body.decode(errors="replace")}


def api_send(server: str, ca: Path, token: str, path: str, body: Json, method: str = "POST") -> Json:
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(server + path, data=json.dumps(body).encode(), method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        return json.loads(response.read())


def api_send_yaml(server: str, ca: Path, token: str, path: str, body: bytes) -> None:
    """POST a YAML manifest as it is (the API server reads YAML); an object that exists is kept."""
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(server + path, data=body, method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/yaml"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=30):
            pass
    except urllib.error.HTTPError as e:
        if e.code != 409:
            raise SystemExit(f"kube: POST {path} refused: HTTP {e.code} {e.read()[:500]!r}") from None


def healthy(port: int) -> bool:
    """Whether a controller's health probe answers /readyz with 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False
