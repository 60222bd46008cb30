"""The HTTP side of a ``PrometheusConnection``: the requests session that checks TLS as the
settings say, and the auth that adds their headers and credentials to every request (secret
files read again after they change, ``promconnection.SecretFile``)."""

from __future__ import annotations

import requests
import urllib3
from requests.auth import AuthBase, HTTPBasicAuth

from gpusteward.adapters.promconnection import PrometheusConnection, SecretFile

__all__ = ["Credentials", "credentials", "session"]


def session(connection: PrometheusConnection) -> requests.Session:
    http = requests.Session()
    if connection.insecure_skip_verify:
        # Asked for explicitly: say so once here rather than on every request.
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        http.verify = False
    elif connection.ca_file:
        http.verify = str(connection.ca_file)
    return http


def credentials(connection: PrometheusConnection) -> Credentials:
    token, password = connection.secrets()
    return Credentials(dict(connection.headers), token, connection.basic_auth_user, password)


class Credentials(AuthBase):
    """Adds the extra headers and the Authorization header to every request."""

    def __init__(self, headers: dict[str, str], token: SecretFile | None,
                 user: str | None, password: SecretFile | None):
        self.headers, self.token, self.user, self.password = headers, token, user, password

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers.update(self.headers)
        if self.token is not None:
            request.headers["Authorization"] = f"Bearer {self.token.value()}"
        elif self.user is not None and self.password is not None:
            return HTTPBasicAuth(self.user, self.password.value())(request)
        return request
