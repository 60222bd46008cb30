"""One log format for every component: UTC ISO 8601 timestamps, as text or as JSON lines.

text: ``2026-11-30T12:00:00.123Z INFO gpusteward.reclaimer message pod=ns/name team=a``
json: ``{"time": "2026-11-30T12:00:00.123Z", "level": "info", "logger": "...", "message":
"...", "pod": "ns/name", "team": "a"}`` — one object per line; the object fields are what the
code passes as ``extra`` (pod, node, team, ...), so a log pipeline can filter on them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any, TextIO

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def add_log_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("logging")
    group.add_argument("--log-level", default="info", choices=LEVELS,
                       help="least severe level written")
    group.add_argument("--log-format", default="text", choices=FORMATS,
                       help="text lines, or one JSON object per line (time, level, logger, "
                            "message and fields such as pod, node, team)")


def utc_time(record: logging.LogRecord) -> str:
    seconds = int(record.created)
    millis = int((record.created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{utc_time(record)} {record.levelname} {record.name} {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {"time": utc_time(record), "level": record.levelname.lower(),
                                 "logger": record.name, "message": record.getMessage()}
        entry.update(fields(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Replace the root handlers: every logger (ours, aiohttp's, the Kubernetes client's)
    writes through this one format to stderr."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
