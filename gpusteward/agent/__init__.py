"""The NVML node agent: GPU telemetry with dcgm-exporter's names, read straight from the driver.

Layers inside the package: ``collect`` and ``exposition`` (pure, over ``core.nodereadings``),
``poddirectory`` (API server), and on top ``app`` (aiohttp) and ``cli``. The systems it reads
have their adapters in ``gpusteward.adapters``: ``nvml``, ``nvmlcall`` and ``xidevents`` (the
only importers of pynvml), ``podresources`` (kubelet gRPC) and ``pidmap`` (/proc).
"""
