"""Kubeconfig loading as kubectl does it.

The rules are client-go's ``ClientConfigLoadingRules.Load`` (kubernetes/kubernetes,
staging/src/k8s.io/client-go/tools/clientcmd/loader.go): an explicit --kubeconfig must exist;
otherwise the KUBECONFIG path list is merged, missing and empty entries skipped; "the first file
to set a particular map key wins and map key's value is never changed", which also holds for
current-context (struct values are merged in reverse order); relative paths resolve against the
file's own folder; no file at all falls back to in-cluster. The files below are kubeconfig v1
documents of the shape ``kubectl config view`` prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusteward.adapters.errors import KubeConfigError
from gpusteward.adapters.kube import connect
from tests.support.tls import make_pki


def kubeconfig(path: Path, clusters: dict[str, dict[str, Any]], contexts: dict[str, str],
               current: str | None = None) -> Path:
    """A file with the given clusters, one token user per cluster, and contexts name->cluster."""
    doc: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": n, "cluster": c} for n, c in clusters.items()],
        "users": [{"name": f"{n}-user", "user": {"token": f"token-{n}-{path.stem}"}}
                  for n in clusters],
        "contexts": [{"name": ctx, "context": {"cluster": cl, "user": f"{cl}-user"}}
                     for ctx, cl in contexts.items()],
    }
    if current:
        doc["current-context"] = current
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(autouse=True)
def no_ambient_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No KUBECONFIG, an empty home and no in-cluster service: each test sets what it needs."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    return home


async def host_and_token(kubeconfig_flag: str | None = None,
                         context: str | None = None) -> tuple[str, str]:
    api = await connect(kubeconfig_flag, context)
    try:
        cfg = api.configuration
        return cfg.host, cfg.api_key["BearerToken"]
    finally:
        await api.close()


async def test_a_kubeconfig_path_list_merges_with_the_first_file_winning_each_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = kubeconfig(tmp_path / "first.yaml", {"shared": {"server": "https://first:6443"}},
                       {"shared": "shared"})
    second = kubeconfig(tmp_path / "second.yaml",
                        {"shared": {"server": "https://second:6443"},
                         "staging": {"server": "https://staging:6443"}},
                        {"shared": "staging", "staging": "staging"}, current="staging")
    monkeypatch.setenv("KUBECONFIG", f"{first}:{tmp_path / 'missing.yaml'}::{second}")

    # current-context: the first file sets none, so the second's applies.
    assert await host_and_token() == ("https://staging:6443", "Bearer token-staging-second")
    # The context "shared" and the cluster "shared" both come from the first file only.
    assert await host_and_token(context="shared") == ("https://first:6443",
                                                      "Bearer token-shared-first")


async def test_the_first_file_that_sets_current_context_wins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = kubeconfig(tmp_path / "a.yaml", {"one": {"server": "https://one:6443"}},
                       {"one": "one"}, current="one")
    second = kubeconfig(tmp_path / "b.yaml", {"two": {"server": "https://two:6443"}},
                        {"two": "two"}, current="two")
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")

    assert (await host_and_token())[0] == "https://one:6443"
    assert (await host_and_token(context="two"))[0] == "https://two:6443"


async def test_a_lone_home_kubeconfig_is_used_when_kubeconfig_is_unset(
        no_ambient_config: Path) -> None:
    (no_ambient_config / ".kube").mkdir()
    kubeconfig(no_ambient_config / ".kube" / "config", {"home": {"server": "https://home:6443"}},
               {"home": "home"}, current="home")

    assert (await host_and_token())[0] == "https://home:6443"


async def test_relative_certificate_paths_resolve_against_their_own_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "elsewhere"
    make_pki(folder)  # ApiClient loads the CA file when it is built
    path = kubeconfig(folder / "config", {"c": {"server": "https://c:6443",
                                                "certificate-authority": "ca.crt"}},
                      {"c": "c"}, current="c")
    monkeypatch.chdir(tmp_path)

    api = await connect(str(path))
    try:
        assert api.configuration.ssl_ca_cert == str(folder / "ca.crt")
    finally:
        await api.close()


@pytest.mark.parametrize(("flag", "env", "context", "expected"), [
    pytest.param("/nowhere/config", None, None, "--kubeconfig /nowhere/config: no such file",
                 id="explicit-file-missing"),
    pytest.param(None, "/nowhere/a:/nowhere/b", None,
                 "no kubeconfig and not in a cluster: --kubeconfig not given; "
                 "KUBECONFIG=/nowhere/a:/nowhere/b: none of its files exists; in-cluster: "
                 "Service host/port is not set.", id="path-list-all-missing"),
    pytest.param(None, None, None, "no kubeconfig and not in a cluster: --kubeconfig not "
                 "given; {home}/.kube/config: no such file (KUBECONFIG is unset); in-cluster: "
                 "Service host/port is not set.", id="nothing-at-all"),
    pytest.param(None, None, "prod", "--context prod needs a kubeconfig, and {home}/.kube/"
                 "config: no such file (KUBECONFIG is unset)", id="context-without-kubeconfig"),
])
async def test_no_usable_kubeconfig_is_one_line_naming_what_was_tried(
        flag: str | None, env: str | None, context: str | None, expected: str,
        monkeypatch: pytest.MonkeyPatch, no_ambient_config: Path) -> None:
    if env:
        monkeypatch.setenv("KUBECONFIG", env)
    with pytest.raises(KubeConfigError) as caught:
        await connect(flag, context)
    assert str(caught.value) == expected.format(home=no_ambient_config)


async def test_an_unknown_context_names_the_contexts_there_are(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", {"a": {"server": "https://a:6443"},
                                            "b": {"server": "https://b:6443"}},
                      {"a": "a", "b": "b"}, current="a")
    with pytest.raises(KubeConfigError) as caught:
        await connect(str(path), "prod")
    assert str(caught.value) == (f"context 'prod' is not in --kubeconfig {path} "
                                 "(contexts: a, b)")


async def test_no_current_context_asks_for_context(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", {"a": {"server": "https://a:6443"}}, {"a": "a"})
    with pytest.raises(KubeConfigError, match=r"sets no current-context; pass --context "
                                              r"\(contexts: a\)$"):
        await connect(str(path))


async def test_a_kubeconfig_that_is_not_yaml_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text("clusters: [\n  - name: a\n")
    with pytest.raises(KubeConfigError) as caught:
        await connect(str(path))
    assert str(caught.value).startswith(f"kubeconfig {path}: not YAML: ")
    assert "\n" not in str(caught.value)
