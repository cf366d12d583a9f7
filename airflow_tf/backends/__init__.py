"""Where a group runs. One protocol (:mod:`.base`), one implementation per place."""

from __future__ import annotations

import inspect
from typing import Any

from .base import Backend, BackendError, ComponentRefusedError, GroupRef

BACKENDS = ("local", "kubernetes")


def get_backend(name: str = "local", **options: Any) -> Backend:
    """A backend by name with its settings (``state_dir`` for local; ``kubernetes_conn_id``,
    ``namespace``, ``in_cluster``, ``config_file``, ``cluster_context`` for kubernetes)."""
    backend: type[Backend]
    if name == "local":
        from .local import LocalBackend as backend
    elif name == "kubernetes":
        from .kubernetes import KubernetesBackend as backend
    else:
        raise BackendError(f"backend {name!r} is not one of {', '.join(BACKENDS)}")
    known = inspect.signature(backend).parameters
    if unknown := sorted(set(options) - set(known)):
        # A misspelt option would otherwise be Python's "unexpected keyword argument".
        raise BackendError(f"the {name} backend has no option {unknown[0]!r} (backend_options, "
                           f"[airflow_tf] backend_options); its options are: {', '.join(known)}")
    return backend(**options)


def backend_for(ref: GroupRef | dict[str, Any]) -> Backend:
    """The backend that launched ``ref`` (a GroupRef or its XCom dict), reconnected."""
    ref = GroupRef.coerce(ref)
    options = dict(ref.options)
    if ref.namespace is not None:
        options["namespace"] = ref.namespace
    return get_backend(ref.backend, **options)


__all__ = ["BACKENDS", "Backend", "BackendError", "ComponentRefusedError", "GroupRef", "backend_for", "get_backend"]
