"""Shared fixtures: a real Prometheus, a live DCGM endpoint, and one sandbox per session."""

pytest_plugins = ["tests.support.fixtures", "tests.support.sandbox", "tests.support.prebuild",
                  "tests.support.parallel"]
