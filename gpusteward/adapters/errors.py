"""gpusteward's own error tree: adapters translate library errors into these (`from e`)."""


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


class KubeConfigError(AdapterError):
    """No usable kubeconfig or in-cluster service account."""


class PrometheusSettingsError(AdapterError):
    """A Prometheus connection setting that cannot work (missing CA file, unreadable token)."""
