"""The NVML node agent: GPU telemetry with dcgm-exporter's names, read straight from the driver.

Layers inside the package: ``model`` (plain data), ``collect`` and ``exposition`` (pure), the
adapters ``nvml``, ``nvmlcall`` and ``xidevents`` (the only importers of pynvml),
``podresources`` (kubelet gRPC), ``pidmap`` (/proc) and ``poddirectory`` (API server), and on
top ``app`` (aiohttp) and ``cli``.
"""
