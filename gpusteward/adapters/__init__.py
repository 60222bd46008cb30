"""Adapters to the outside world (API server, Prometheus); the only importers of their SDKs."""
