"""A real Prometheus for component and e2e tests: Prometheus 3 built from its Go module by
default, or Debian's package ``prometheus`` 2.42 (``major="2"``, or ``GPUSTEWARD_PROMETHEUS=2``;
gpusteward.sandbox.controllers.prometheus_binaries).

Tests talk to the real server because a fake query API would agree with our
PromQL bugs. ``PrometheusServer`` backfills DCGM-shaped history with
``promtool tsdb create-blocks-from openmetrics`` into an empty TSDB *before*
starting Prometheus, then scrapes the given targets (``honor_labels: true``, so
the exporter's ``pod``/``namespace``/``container`` survive as they are).

What we found about backfill and the head block (tried against 2.42; the component tier's
``[prometheus-3]`` runs show the head and lookback points hold on 3.16 too):

* No flag is needed for backfilled blocks that reach up to "now".
  ``--storage.tsdb.allow-overlapping-blocks`` is still accepted (hidden, "This
  flag has no effect"): since 2.39 overlapping blocks are always allowed.
* Blocks found at start-up are queried right away, next to the (empty) head:
  a query ending at "now" sees history up to its last sample; an instant query
  needs a sample within the 5-minute lookback, so use ``*_over_time`` for older
  history.
* On open, the head takes the newest block's end as its lowest valid time, so
  a scraped sample older than the last backfilled sample is dropped as out of
  bounds — for every series, not only the backfilled ones. Keep the newest
  history sample at or before the moment Prometheus starts (in the past, not in
  the future) and history and live scrapes join up; no other margin is needed.
* Prometheus's first scrape of a target comes about 5 s after it is ready on
  2.42 (service discovery hands out targets at most every 5 s) and about 1 s
  on 3.x with ``--scrape.discovery-reload-interval=1s`` (its discovery manager
  sends at once; the scrape manager waits that long), so live-scrape tests poll
  for their series instead of sleeping one interval.
* Retention counts back from the newest block, not the clock (tsdb's
  ``BeyondTimeRetention``; not tried here); a long
  ``--storage.tsdb.retention.time`` makes sure old fixtures are never cut.
* promtool writes 2-hour-aligned blocks; backfilling into a *running* server is
  what the upstream docs warn about, which is why history goes in first.
"""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import bcrypt

from gpusteward.sandbox.build import SandboxBuildError
from gpusteward.sandbox.controllers import prometheus_binaries
from gpusteward.sandbox.procs import free_port
from gpusteward.sandbox.scrape import DCGM_EXPORTER, Exporter
from tests.support.tls import Pki

__all__ = ["SCRAPE_JOB", "PrometheusError", "PrometheusServer", "WebConfig", "servicemonitor",
           "stored_labels"]

Scrape = Callable[[str, list[tuple[str, str]]], list[tuple[str, str]]]

#: ``job`` label of every scrape target the harness configures.
SCRAPE_JOB = "dcgm"

_READY_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0
_PORT_ATTEMPTS = 3
_LOG_TAIL_CHARS = 4000
_INSTALL_HINT = (
    "Prometheus 3 is built from its Go module on first use (needs `go`); the 2.x is the Debian "
    "package `prometheus` `make setup` installs (apt-get install prometheus), which provides "
    "both `prometheus` and `promtool`"
)


class PrometheusError(RuntimeError):
    """Prometheus or promtool is missing, failed, or answered with an error."""


class PrometheusServer:
    """One Prometheus process on a free loopback port, with its files in ``workdir``."""

    def __init__(
        self,
        workdir: Path,
        *,
        history_openmetrics: str | None = None,
        scrape_targets: Sequence[str] = (),
        scrape_interval: str = "1s",
        scrape_configs: Sequence[dict[str, Any]] = (),
        prometheus_bin: str | None = None,
        promtool_bin: str | None = None,
        major: str | None = None,
        web: WebConfig | None = None,
        external_labels: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.external_labels = dict(external_labels or {})  # a Thanos sidecar requires some
        self.web = web
        self.history_openmetrics = history_openmetrics
        self.scrape_targets = list(scrape_targets)
        self.scrape_interval = scrape_interval
        self.scrape_configs = list(scrape_configs)  # jobs of their own, as they are
        self.prometheus_bin = prometheus_bin  # None: those of ``major``
        self.promtool_bin = promtool_bin
        self.major = major  # None: $GPUSTEWARD_PROMETHEUS, else 3
        self.url = ""
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    @property
    def tsdb_path(self) -> Path:
        return self.workdir / "tsdb"

    def start(self) -> None:
        prometheus, promtool = self.binaries()
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.history_openmetrics is not None:
            self._backfill(promtool)
        config = self.workdir / "prometheus.yml"
        config.write_text(self._config())  # JSON is YAML, and needs no quoting rules
        for attempt in range(_PORT_ATTEMPTS):
            try:
                self._launch(prometheus, config)
                return
            except PrometheusError:
                # Another process may have taken the free port between probe and bind.
                if attempt + 1 == _PORT_ATTEMPTS or "address already in use" not in self.log_tail():
                    raise

    def binaries(self) -> tuple[str, str]:
        """(prometheus, promtool) this server runs, on PATH or as paths."""
        prometheus, promtool = self.prometheus_bin, self.promtool_bin
        if prometheus is None or promtool is None:
            try:
                built = prometheus_binaries(self.major, log=lambda _: None)
            except SandboxBuildError as e:
                raise PrometheusError(f"{e}; {_INSTALL_HINT}") from e
            prometheus, promtool = prometheus or built[0], promtool or built[1]
        return _require(prometheus), _require(promtool)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    @property
    def pid(self) -> int:
        """The running server's process id (its CPU time is what benchmarks read)."""
        if self._process is None:
            raise PrometheusError("prometheus is not running")
        return self._process.pid

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def api(self, path: str, **params: str | float) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data``; raise on an error answer."""
        query = urllib.parse.urlencode(params)
        try:
            url = f"{self.url}/api/v1/{path}?{query}"
            with self._open(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            raise PrometheusError(f"{path} {params}: HTTP {e.code}: {detail}") from e
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body}")
        return body["data"]

    def log_tail(self) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return self.log_path.read_text(errors="replace")[-_LOG_TAIL_CHARS:]

    def _launch(self, prometheus: str, config: Path) -> None:
        port = free_port()
        self.url = f"{'https' if self.web and self.web.tls else 'http'}://127.0.0.1:{port}"
        args = [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.tsdb_path}",
            "--storage.tsdb.retention.time=10y",
            # How long the scrape manager waits before it takes new targets (a hidden flag,
            # default 5s, in 2.42 and 3.x): on 3.x the first scrape then comes in about 1 s.
            "--scrape.discovery-reload-interval=1s",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        if self.web:
            web_config = self.workdir / "web.yml"
            web_config.write_text(json.dumps(self.web.config()))
            args.append(f"--web.config.file={web_config}")
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _backfill(self, promtool: str) -> None:
        history = self.workdir / "history.om"
        history.write_text(self.history_openmetrics or "")
        args = [
            promtool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(history),
            str(self.tsdb_path),
        ]
        result = subprocess.run(args, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            output = result.stdout + result.stderr
            raise PrometheusError(f"promtool backfill of {history} failed:\n{output}")

    def _config(self) -> str:
        job = {
            "job_name": SCRAPE_JOB,
            "honor_labels": True,
            "scrape_interval": self.scrape_interval,
            "scrape_timeout": self.scrape_interval,  # must not exceed the interval
            "static_configs": [{"targets": self.scrape_targets}],
        }
        scrape_configs = [job] if self.scrape_targets else []
        global_ = {"scrape_interval": self.scrape_interval, "scrape_timeout": self.scrape_interval}
        if self.external_labels:
            global_["external_labels"] = self.external_labels
        return json.dumps({"global": global_,
                           "scrape_configs": scrape_configs + self.scrape_configs}, indent=2)

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._process = None
                raise PrometheusError(f"prometheus exited before it was ready:\n{self.log_tail()}")
            try:
                with self._open(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        waited = f"{_READY_TIMEOUT_S:.0f} s"
        raise PrometheusError(f"prometheus not ready after {waited}:\n{self.log_tail()}")


    def _open(self, url: str, timeout: float) -> Any:
        """urlopen, with the CA and credentials a secured server (``web``) asks for."""
        if self.web is None:
            return urllib.request.urlopen(url, timeout=timeout)
        context = ssl.create_default_context(cafile=str(self.web.tls.ca_cert)) \
            if self.web.tls else None
        request = urllib.request.Request(url, headers=self.web.auth_header())
        return urllib.request.urlopen(request, timeout=timeout, context=context)


@dataclass(frozen=True)
class WebConfig:
    """Prometheus's ``--web.config.file`` (prometheus/exporter-toolkit's web configuration):
    TLS with a certificate from ``tls`` and, with ``users``, basic auth for each user (the
    file takes bcrypt hashes only)."""

    tls: Pki | None = None
    users: dict[str, str] = field(default_factory=dict)

    def config(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.tls:
            out["tls_server_config"] = {"cert_file": str(self.tls.server_cert),
                                        "key_file": str(self.tls.server_key)}
        if self.users:
            out["basic_auth_users"] = {  # cost 4, the least bcrypt takes: tests stay quick
                user: bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
                for user, password in self.users.items()}
        return out

    def auth_header(self) -> dict[str, str]:
        if not self.users:
            return {}
        user, password = next(iter(self.users.items()))
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {token}"}


def stored_labels(exposed: Sequence[tuple[str, str]], target: Mapping[str, str],
                  honor_labels: bool) -> list[tuple[str, str]]:
    """The labels Prometheus stores for one scraped series with these target labels.

    Prometheus's scrape loop (``mutateSampleLabels``, scrape/scrape.go): with ``honor_labels``
    the series keeps its own value of a label both carry and gains the target's others; without
    it, each clashing label of the series is renamed ``exported_<name>`` and the target's value
    set. An empty label is no label. Checked live against this Prometheus in
    tests/component/test_prometheus_harness.py.
    """
    out = {k: v for k, v in exposed if v}
    for name, value in target.items():
        if name not in out:
            out[name] = value
        elif not honor_labels:
            out[f"exported_{name}"] = out[name]
            out[name] = value
    return list(out.items())


def servicemonitor(honor_labels: bool, exporter: Exporter = DCGM_EXPORTER,
                   node_label: str | None = None,
                   node_of: Mapping[str, str] | None = None) -> Scrape:
    """``render_openmetrics_history(scrape=...)``: what Prometheus stores from each node's
    exporter pod under a Prometheus Operator ServiceMonitor (gpusteward.sandbox.scrape), plus
    the target's ``node_label`` where a relabeling adds one (as in NVIDIA/gpu-operator#472).
    ``node_of``: the node of an exporter whose series name another (its Hostname)."""

    def scrape(hostname: str, labels: list[tuple[str, str]]) -> list[tuple[str, str]]:
        node = (node_of or {}).get(hostname, hostname)
        target = {**exporter.target_labels(node), "instance": f"{node}:9400"}
        if node_label:
            target[node_label] = node
        return stored_labels(labels, target, honor_labels)

    return scrape


def _require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise PrometheusError(f"{binary!r} not found on PATH; {_INSTALL_HINT}")
    return path
