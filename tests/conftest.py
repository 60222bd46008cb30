"""Shared fixtures: a real Prometheus and a live DCGM endpoint for any test that asks."""

pytest_plugins = ["tests.support.fixtures"]
