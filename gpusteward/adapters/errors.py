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


class LeaseLost(AdapterError):
    """This replica may not write to the cluster now: it does not hold the Lease (any more),
    or cannot show the API server that it does."""
