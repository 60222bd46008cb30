"""Prometheus connection settings: flags and environment variables into one checked object;
bad values are one line and exit 2; secrets stay out of logs. The requests these settings make
against a real TLS + basic-auth Prometheus and a bearer-token gateway are in
tests/component/test_prometheus_connection.py."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import pytest

from gpusteward.adapters.connectflags import add_connection_flags, prometheus_connection
from gpusteward.adapters.errors import PrometheusSettingsError
from gpusteward.adapters.promconnection import PrometheusConnection, SecretFile
from gpusteward.cli import main
from tests.support.tls import make_pki

REPO = Path(__file__).resolve().parents[2]
POLICY = str(REPO / "deploy" / "policy.example.yaml")


def settings(*flags: str, env: dict[str, str] | None = None,
             policy_url: str | None = None) -> PrometheusConnection | None:
    parser = argparse.ArgumentParser()
    add_connection_flags(parser)
    return prometheus_connection(parser.parse_args(list(flags)), policy_url, env or {})


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("s3cret-token\n")
    return path


def test_flags_win_over_environment_variables_which_win_over_the_policy(
        tmp_path: Path, secret: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    env = {"PROMETHEUS_URL": "https://env:9090",
           "GPUSTEWARD_PROMETHEUS_CA_FILE": str(pki.ca_cert),
           "GPUSTEWARD_PROMETHEUS_BEARER_TOKEN_FILE": str(secret),
           "GPUSTEWARD_PROMETHEUS_HEADERS": "X-Scope-OrgID: team-a\nX-Extra: 1\n"}

    from_env = settings(env=env, policy_url="http://policy:9090")
    assert from_env == PrometheusConnection(
        url="https://env:9090", ca_file=pki.ca_cert, bearer_token_file=secret,
        headers=(("X-Scope-OrgID", "team-a"), ("X-Extra", "1")))

    from_flags = settings("--prometheus-url", "https://flag:9090",
                          "--prometheus-header", "X-Scope-OrgID: team-b", env=env)
    assert from_flags is not None
    assert (from_flags.url, from_flags.headers) == ("https://flag:9090",
                                                    (("X-Scope-OrgID", "team-b"),))
    assert settings(policy_url="http://policy:9090") == PrometheusConnection(
        "http://policy:9090")
    assert settings() is None


def test_insecure_skip_verify_is_off_unless_asked() -> None:
    assert settings(policy_url="https://p").insecure_skip_verify is False  # type: ignore[union-attr]
    assert settings("--prometheus-insecure-skip-verify",  # type: ignore[union-attr]
                    policy_url="https://p").insecure_skip_verify is True
    assert settings(env={"GPUSTEWARD_PROMETHEUS_INSECURE_SKIP_VERIFY": "true"},  # type: ignore[union-attr]
                    policy_url="https://p").insecure_skip_verify is True


@pytest.mark.parametrize(("flags", "expected"), [
    pytest.param(["--prometheus-ca-file", "/nowhere/ca.crt"],
                 "--prometheus-ca-file /nowhere/ca.crt: no such file", id="ca-missing"),
    pytest.param(["--prometheus-ca-file", "{secret}"],
                 "--prometheus-ca-file {secret}: not a PEM CA certificate", id="ca-not-pem"),
    pytest.param(["--prometheus-bearer-token-file", "/nowhere/token"],
                 "cannot read /nowhere/token: No such file or directory", id="token-missing"),
    pytest.param(["--prometheus-bearer-token-file", "{empty}"],
                 "cannot read {empty}: {empty} is empty", id="token-empty"),
    pytest.param(["--prometheus-bearer-token-file", "{secret}",
                  "--prometheus-basic-auth-user", "u",
                  "--prometheus-basic-auth-password-file", "{secret}"],
                 "use either a bearer token or basic auth for Prometheus, not both",
                 id="token-and-basic"),
    pytest.param(["--prometheus-basic-auth-user", "u"],
                 "basic auth needs both --prometheus-basic-auth-user and "
                 "--prometheus-basic-auth-password-file", id="user-without-password"),
    pytest.param(["--prometheus-header", "X-Scope-OrgID team-a"],
                 "--prometheus-header 'X-Scope-OrgID team-a': expected 'NAME: VALUE'",
                 id="header-without-colon"),
    pytest.param(["--prometheus-header", "Authorization: Bearer x"],
                 "--prometheus-header Authorization: use --prometheus-bearer-token-file",
                 id="authorization-header"),
    pytest.param(["--prometheus-ca-file", "{ca}", "--prometheus-insecure-skip-verify"],
                 "--prometheus-ca-file and --prometheus-insecure-skip-verify exclude each "
                 "other", id="ca-and-insecure"),
    pytest.param(["--prometheus-url", "prometheus:9090"],
                 "--prometheus-url 'prometheus:9090': expected http://", id="url-no-scheme"),
])
def test_a_bad_setting_is_one_line(flags: list[str], expected: str, tmp_path: Path,
                                   secret: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    ca = make_pki(tmp_path / "pki").ca_cert if "{ca}" in flags else None
    names = {"secret": secret, "empty": empty, "ca": ca}
    with pytest.raises(PrometheusSettingsError) as caught:
        settings(*(f.format(**names) for f in flags), policy_url="https://p:9090")
    assert str(caught.value).startswith(expected.format(**names))
    assert "\n" not in str(caught.value)


def test_a_bad_environment_switch_is_refused() -> None:
    with pytest.raises(PrometheusSettingsError, match="expected true or false"):
        settings(env={"GPUSTEWARD_PROMETHEUS_INSECURE_SKIP_VERIFY": "maybe"}, policy_url="https://p")


@pytest.mark.parametrize("command", [
    pytest.param(["extender", "--policy", POLICY], id="extender"),
    pytest.param(["reclaimer", "--policy", POLICY, "--once"], id="reclaimer"),
    pytest.param(["report"], id="report"),
])
def test_every_command_exits_2_with_one_line_for_a_missing_ca_file(
        command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*command, "--prometheus-url", "https://p:9090",
            "--prometheus-ca-file", "/nowhere/ca.crt"]
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code  # type: ignore[assignment]
    assert code == 2
    err = capsys.readouterr().err
    assert err == f"gpusteward {command[0]}: --prometheus-ca-file /nowhere/ca.crt: no such file\n"


def test_descriptions_and_reprs_name_files_and_headers_never_their_values(
        secret: Path) -> None:
    connection = PrometheusConnection("https://p:9090", bearer_token_file=secret,
                                      headers=(("X-Api-Key", "key-value-123"),))
    shown = connection.describe() + repr(connection)
    assert str(secret) in shown and "X-Api-Key" in shown
    assert "s3cret-token" not in shown and "key-value-123" not in shown


def test_a_rotated_secret_file_is_read_again_and_a_vanished_one_keeps_the_last(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "token"
    path.write_text("first")
    token = SecretFile(path)
    assert token.value() == "first"
    # kubelet swaps projected tokens in with a rename: a new inode.
    (tmp_path / "token.new").write_text("second")
    os.replace(tmp_path / "token.new", path)
    assert token.value() == "second"
    path.unlink()
    with caplog.at_level(logging.INFO):
        assert token.value() == "second"
    assert f"cannot re-read {path}" in caplog.text
    assert "second" not in caplog.text


def test_credentials_over_plain_http_are_flagged_in_the_description(secret: Path) -> None:
    assert PrometheusConnection("http://p:9090", bearer_token_file=secret).describe().endswith(
        "WARNING: credentials sent over plain http")
    assert "WARNING" not in PrometheusConnection("https://p:9090",
                                                 bearer_token_file=secret).describe()
