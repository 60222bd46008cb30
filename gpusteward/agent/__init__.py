"""The NVML node agent: GPU telemetry with dcgm-exporter's names, read straight from the driver.

Layers inside the package: ``model`` (plain data), ``collect`` and ``exposition`` (pure), the
adapters ``nvml`` (the only importer of pynvml), ``podresources`` (kubelet gRPC) and ``pidmap``
(/proc), and on top ``app`` (aiohttp) and ``cli``.
"""
