"""Where a group runs. One protocol (:mod:`.base`), one implementation per place."""

from __future__ import annotations

from typing import Any

from .base import Backend, BackendError, ComponentRefusedError, GroupRef

BACKENDS = ("local", "kubernetes")


def get_backend(name: str = "local", **options: Any) -> Backend:
    """A backend by name with its settings (``state_dir`` for local; ``kubernetes_conn_id``,
    ``namespace``, ``in_cluster``, ``config_file``, ``cluster_context`` for kubernetes)."""
    if name == "local":
        from .local import LocalBackend

        return LocalBackend(**options)
    if name == "kubernetes":
        from .kubernetes import KubernetesBackend

        return KubernetesBackend(**options)
    raise BackendError(f"backend {name!r} is not one of {', '.join(BACKENDS)}")


def backend_for(ref: GroupRef | dict[str, Any]) -> Backend:
    """The backend that launched ``ref`` (a GroupRef or its XCom dict), reconnected."""
    ref = GroupRef.coerce(ref)
    options = dict(ref.options)
    if ref.namespace is not None:
        options["namespace"] = ref.namespace
    return get_backend(ref.backend, **options)


__all__ = ["BACKENDS", "Backend", "BackendError", "ComponentRefusedError", "GroupRef", "backend_for", "get_backend"]
