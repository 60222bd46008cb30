"""How to reach Prometheus (or Thanos, Mimir, a gateway in front of them): one typed settings
object, checked once at start-up; ``promsession`` builds the HTTP session the telemetry source
uses from it. No HTTP library here: every command's flags module reaches this one through
``connectflags``, and ``gpusteward --help`` or ``policy check`` should not load requests.

TLS is verified unless asked otherwise. Credentials are read from files so that Secrets and
projected ServiceAccount tokens can rotate underneath a running process: a file is read again
when its identity (inode, mtime, size) changes, as client-go does for projected tokens. Secrets
never appear in logs or reprs; only file paths and header names do.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from gpusteward.adapters.errors import PrometheusSettingsError

log = logging.getLogger("gpusteward.telemetry")

_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 token


@dataclass(frozen=True)
class PrometheusConnection:
    url: str
    ca_file: Path | None = None
    insecure_skip_verify: bool = False
    bearer_token_file: Path | None = None
    basic_auth_user: str | None = None
    basic_auth_password_file: Path | None = None
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def check(self) -> None:
        """Raise PrometheusSettingsError (one line) for anything that cannot work."""
        if not re.match(r"^https?://[^/]", self.url):
            raise PrometheusSettingsError(f"--prometheus-url {self.url!r}: expected "
                                          "http://HOST[:PORT][/PATH] or https://...")
        if self.ca_file and self.insecure_skip_verify:
            raise PrometheusSettingsError("--prometheus-ca-file and "
                                          "--prometheus-insecure-skip-verify exclude each other")
        if self.ca_file:
            _check_ca(self.ca_file)
        basic = self.basic_auth_user is not None or self.basic_auth_password_file is not None
        if basic and self.bearer_token_file:
            raise PrometheusSettingsError("use either a bearer token or basic auth for "
                                          "Prometheus, not both")
        if basic and not (self.basic_auth_user and self.basic_auth_password_file):
            raise PrometheusSettingsError("basic auth needs both --prometheus-basic-auth-user "
                                          "and --prometheus-basic-auth-password-file")
        for name, _ in self.headers:
            check_header_name(name)
        self.secrets()  # reads the secret files once: unreadable or empty fails here

    def describe(self) -> str:
        """For logs: where, how TLS is checked, which credentials (never their values)."""
        parts = [self.url]
        if self.url.startswith("https://"):
            parts.append("TLS NOT verified" if self.insecure_skip_verify
                         else f"CA {self.ca_file}" if self.ca_file else "system CAs")
        if self.bearer_token_file:
            parts.append(f"bearer token from {self.bearer_token_file}")
        if self.basic_auth_user:
            parts.append(f"basic auth as {self.basic_auth_user!r} "
                         f"(password from {self.basic_auth_password_file})")
        if self.headers:
            parts.append("headers " + ", ".join(name for name, _ in self.headers))
        if self.url.startswith("http://") and (self.bearer_token_file or self.basic_auth_user):
            parts.append("WARNING: credentials sent over plain http")
        return "; ".join(parts)

    def secrets(self) -> tuple[SecretFile | None, SecretFile | None]:
        """The bearer token's and the basic auth password's files, each read now."""
        token = SecretFile(self.bearer_token_file) if self.bearer_token_file else None
        password = (SecretFile(self.basic_auth_password_file)
                    if self.basic_auth_password_file else None)
        return token, password


class SecretFile:
    """A secret kept in a file (a mounted Secret or projected token); read again after it
    changes. A failed re-read keeps the last good value and logs the path, never the value."""

    def __init__(self, path: Path):
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._value = ""
        self.value()  # fail at start-up, not at the first query

    def value(self) -> str:
        try:
            st = os.stat(self.path)
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if seen != self._seen:
                text = self.path.read_text().strip()
                if not text:
                    raise PrometheusSettingsError(f"{self.path} is empty")
                self._value, self._seen = text, seen
                log.info("read the Prometheus credential in %s", self.path)
        except (OSError, UnicodeDecodeError, PrometheusSettingsError) as e:
            if not self._value:
                raise PrometheusSettingsError(f"cannot read {self.path}: {_reason(e)}") from e
            log.warning("cannot re-read %s (%s); keeping the credential read before",
                        self.path, _reason(e))
        return self._value


def parse_header(text: str) -> tuple[str, str]:
    """``'X-Scope-OrgID: team-a'`` -> ("X-Scope-OrgID", "team-a")."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not name:
        raise PrometheusSettingsError(f"--prometheus-header {text!r}: expected 'NAME: VALUE'")
    if "\n" in value or "\r" in value:
        raise PrometheusSettingsError(f"--prometheus-header {name}: the value spans lines")
    check_header_name(name)
    return name, value


def check_header_name(name: str) -> None:
    if not _HEADER_NAME.match(name):
        raise PrometheusSettingsError(f"--prometheus-header {name!r}: not a valid header name")
    if name.lower() == "authorization":
        raise PrometheusSettingsError(
            "--prometheus-header Authorization: use --prometheus-bearer-token-file or basic "
            "auth, which read the secret from a file and follow its rotation")


def _check_ca(path: Path) -> None:
    try:
        ssl.create_default_context(cafile=str(path))
    except FileNotFoundError as e:
        raise PrometheusSettingsError(f"--prometheus-ca-file {path}: no such file") from e
    except (OSError, ssl.SSLError) as e:
        raise PrometheusSettingsError(f"--prometheus-ca-file {path}: not a PEM CA "
                                      f"certificate ({_reason(e)})") from e


def _reason(error: Exception) -> str:
    return error.strerror if isinstance(error, OSError) and error.strerror else str(error)
