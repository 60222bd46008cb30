"""gpusteward's own error tree: adapters translate library errors into these (`from e`)."""

import os


class AdapterError(Exception):
    """Base of errors raised by an adapter."""


class TelemetryUnavailable(AdapterError):
    """Prometheus unreachable, timing out, or answering with something we cannot read."""


class KubeError(AdapterError):
    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class WatchExpired(KubeError):
    """410 Gone: the resourceVersion is too old; list again."""


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
