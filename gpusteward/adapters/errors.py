"""gpusteward's own error tree: adapters translate library errors into these (`from e`)."""

import os


class AdapterError(Exception):
    """Base of errors raised by an adapter."""


class TelemetryUnavailable(AdapterError):
    """Prometheus unreachable, timing out, or answering with something we cannot read."""


class KubeError(AdapterError):
    """An API server call that failed: ``status`` is the HTTP status it answered, 0 where no
    answer was read (unreachable, timed out) or the error wraps another (a record's)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class KubeRefused(KubeError):
    """The API server answered a call with a status that is not 2xx. ``reason``: what the
    answer said as the caller logs it (the status line's phrase from the SDK's typed client,
    the Status message of a body read raw); ``detail``: that Status message, "" when none.
    ``kube_error`` picks the subclass: one for each status gpusteward acts on."""

    STATUS = 0

    def __init__(self, message: str, status: int = 0, reason: str = "", detail: str = ""):
        super().__init__(message, status)
        self.reason, self.detail = reason, detail


class KubeForbidden(KubeRefused):
    """403: RBAC does not grant the call; the log names the permission."""

    STATUS = 403


class KubeNotFound(KubeRefused):
    """404: the object (or its kind, or its API group) is not there."""

    STATUS = 404


class KubeConflict(KubeRefused):
    """409: the object changed since the resourceVersion the write carried, or exists
    already: read again."""

    STATUS = 409


class WatchExpired(KubeRefused):
    """410 Gone: the resourceVersion is too old; list again."""

    STATUS = 410


class KubeUnprocessable(KubeRefused):
    """422: the write is invalid as sent; for a JSON patch, also a ``test`` op that failed
    (the field no longer holds what the patch expected)."""

    STATUS = 422


class KubeTooManyRequests(KubeRefused):
    """429: an eviction a PodDisruptionBudget does not allow now (or the server's rate
    limit): try again next cycle."""

    STATUS = 429


_BY_STATUS: dict[int, type[KubeRefused]] = {
    c.STATUS: c for c in (KubeForbidden, KubeNotFound, KubeConflict, WatchExpired,
                          KubeUnprocessable, KubeTooManyRequests)}


def kube_error(status: int, reason: str, message: str = "", detail: str = "") -> KubeRefused:
    """The one place an API server's status becomes a class of the tree; every status not
    acted on is a plain KubeRefused. ``message`` defaults to the line a command prints."""
    cls = _BY_STATUS.get(status, KubeRefused)
    return cls(message or f"the API server answered HTTP {status} {reason}", status, reason,
               detail)


class SettingsError(AdapterError):
    """A flag, variable or file the user gave that cannot work: the command exits 2."""


class ListenError(AdapterError):
    """A port that cannot be served (in use, privileged, an address not on this host)."""

    def __init__(self, host: str, port: int, error: OSError):
        # asyncio wraps the errno in a sentence of its own; getaddrinfo's errors are negative.
        if error.errno and error.errno > 0:
            reason = os.strerror(error.errno)
        else:
            reason = error.strerror or str(error)
        super().__init__(f"cannot listen on {host}:{port}: {reason}")


class KubeConfigError(SettingsError):
    """No usable kubeconfig or in-cluster service account."""


class PrometheusSettingsError(SettingsError):
    """A Prometheus connection setting that cannot work (missing CA file, unreadable token)."""


class LeaseLost(AdapterError):
    """This replica may not write to the cluster now: it does not hold the Lease (any more),
    or cannot show the API server that it does."""
