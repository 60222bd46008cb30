"""A webhook receiver on 127.0.0.1 for the demo and the tests: it keeps every JSON body POSTed
to it, and can be told to answer 500 or to hang, as a broken receiver would."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class Receiver:
    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []  # bodies taken (answered 2xx), in order
        self.keys: list[str] = []  # their Idempotency-Key headers
        self.attempts = 0  # every POST, taken or not
        self.mode = "ok"  # ok | fail (HTTP 500) | hang (no answer for `hang_for` seconds)
        self.hang_for = 30.0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.attempts += 1
                    mode = receiver.mode
                if mode == "hang":
                    time.sleep(receiver.hang_for)
                    return
                if mode == "fail":
                    self.send_error(500)
                    return
                with receiver.lock:
                    receiver.received.append(json.loads(body))
                    receiver.keys.append(self.headers.get("Idempotency-Key", ""))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/hook"

    def url_file(self, directory: Path, name: str = "url") -> Path:
        """The URL written to a file, as a mounted Secret would hold it."""
        path = directory / name
        path.write_text(self.url + "\n")
        return path

    def bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.received)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
