"""Where a group runs. One protocol (:mod:`.base`), one implementation per place."""

from __future__ import annotations

from typing import Any

from .base import Backend, BackendError, ComponentRefusedError, GroupRef
from .options import BackendOptionError, check_options

BACKENDS = ("local", "kubernetes")


def _backend_class(name: str) -> Any:
    if name == "local":
        from .local import LocalBackend

        return LocalBackend
    if name == "kubernetes":
        from .kubernetes import KubernetesBackend

        return KubernetesBackend
    raise BackendError(f"backend {name!r} is not one of {', '.join(BACKENDS)}")


def check_backend_options(name: str, options: dict[str, Any], where: str) -> dict[str, Any]:
    """``options`` of backend ``name`` when every key is one of its options and every value has the
    right type and range; else :class:`BackendOptionError` (a ValueError) naming ``where`` (the
    setting or argument they came from), each wrong key and what it expects."""
    return check_options(name, _backend_class(name).OPTIONS, options, where)


def get_backend(name: str = "local", **options: Any) -> Backend:
    """A backend by name with its options (``state_dir`` for local; ``kubernetes_conn_id``,
    ``namespace``, ``network_policy``, ... for kubernetes: each backend's ``OPTIONS``), every
    option checked first (:func:`check_backend_options`)."""
    check_backend_options(name, options, "backend_options")
    return _backend_class(name)(**options)


def backend_for(ref: GroupRef | dict[str, Any]) -> Backend:
    """The backend that launched ``ref`` (a GroupRef or its XCom dict), reconnected."""
    ref = GroupRef.coerce(ref)
    options = dict(ref.options)
    if ref.namespace is not None:
        options["namespace"] = ref.namespace
    return get_backend(ref.backend, **options)


__all__ = ["BACKENDS", "Backend", "BackendError", "BackendOptionError", "ComponentRefusedError", "GroupRef",
           "backend_for", "check_backend_options", "get_backend"]
