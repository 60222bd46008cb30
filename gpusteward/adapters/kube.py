"""The API server side: connection, and a list+watch cache of Nodes and GPU Pods.

kubernetes-asyncio gives us auth and transport; list and watch bodies are read raw and decoded
into our own structs (msgspec), which is ~60x faster than building its models for large fleets.

Its errors end here: ``kube_errors`` raises the SDK's ApiException as gpusteward's own
(adapters/errors.py ``kube_error``, by status), and a status read raw is mapped by the same
function, so callers catch ``KubeNotFound``, ``KubeConflict``... and never compare numbers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential_jitter

from gpusteward.adapters.errors import (
    KubeConfigError,
    KubeError,
    KubeForbidden,
    KubeRefused,
    WatchExpired,
    kube_error,
)
from gpusteward.adapters.kubeconfig import locate, pick_context, read_merged
from gpusteward.core.fleet import FleetWriter
from gpusteward.core.kubewire import QuantityError, WireNode, WirePod, to_node, to_pod
from gpusteward.core.model import Pod

log = logging.getLogger("gpusteward.kube")


WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CALL_TIMEOUT = 30.0  # seconds per API call: a hung call must not stall a cycle


class GatedClient(client.ApiClient):
    """The SDK's client with one gate every write passes, typed and raw calls alike: the
    reclaimer sets ``gate`` to its Lease deadline (adapters.lease), so no write starts once this
    replica may no longer act, checked immediately before the request leaves. ``gate`` raises
    to refuse; None (every other app) lets everything through."""

    gate: Callable[[str], None] | None = None

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if self.gate is not None and method in WRITES:
            self.gate(url)
        return super().request(method, url, *args, **kwargs)


def api_error(e: ApiException) -> KubeRefused:
    """The SDK's refusal as gpusteward's: the class by its status, its reason as the SDK read
    it (the status line's phrase), the Status message of its body as ``detail``."""
    body = e.body or b""
    try:
        detail = msgspec.json.decode(body, type=Status).message
    except (msgspec.DecodeError, TypeError):
        detail = ""
    return kube_error(e.status or 0, e.reason or "", detail=detail)


@contextmanager
def kube_errors() -> Iterator[None]:
    """Around calls to the API server: an ApiException raised inside comes out as the typed
    KubeRefused (``from`` it); gpusteward's own errors pass as they are."""
    try:
        yield
    except ApiException as e:
        raise api_error(e) from e


async def connect(kubeconfig: str | None, context: str | None = None) -> GatedClient:
    """Connect as kubectl would: --kubeconfig, else $KUBECONFIG (a path list), else
    ~/.kube/config, else the in-cluster service account (see adapters/kubeconfig.py)."""
    choice = locate(kubeconfig, os.environ.get("KUBECONFIG"), Path.home())
    if not choice.files:
        return _in_cluster(f"{choice.source}: {choice.missing}", context)
    merged = read_merged(choice.files)
    chosen = pick_context(merged, context, choice.source)
    cfg = type.__call__(client.Configuration)  # a fresh one, as new_client_from_config_dict
    try:
        await config.load_kube_config_from_dict(merged, context=chosen, client_configuration=cfg)
        return GatedClient(configuration=cfg)
    except (ConfigException, ssl.SSLError, KeyError, TypeError, ValueError) as e:
        raise KubeConfigError(f"{choice.source}, context {chosen!r}: {e}") from e


def _in_cluster(tried: str, context: str | None) -> GatedClient:
    if context:
        raise KubeConfigError(f"--context {context} needs a kubeconfig, and {tried}")
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except ConfigException as e:
        raise KubeConfigError(f"no kubeconfig and not in a cluster: --kubeconfig not given; "
                              f"{tried}; in-cluster: {e}") from e
    return GatedClient(configuration=cfg)


class Event(msgspec.Struct):
    type: str
    object: msgspec.Raw


class ListMeta(msgspec.Struct, rename="camel"):
    resource_version: str = ""
    # `continue` is a Python keyword; msgspec maps it by name.
    continue_: str | None = msgspec.field(default=None, name="continue")


class RawList(msgspec.Struct):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[msgspec.Raw] = msgspec.field(default_factory=list)


class Status(msgspec.Struct):
    code: int = 0
    message: str = ""


_list_decoder = msgspec.json.Decoder(RawList)
_event_decoder = msgspec.json.Decoder(Event)
_node_decoder = msgspec.json.Decoder(WireNode)
_pod_decoder = msgspec.json.Decoder(WirePod)


class Watcher:
    """Keeps one kind (`nodes` or `pods`) of a fleet (core.fleet.FleetWriter) in step with the API
    server."""

    def __init__(self, api: client.ApiClient, store: FleetWriter, kind: str,
                 resources: Sequence[str], clock: Callable[[], float] = time.time,
                 page_size: int = 500, watch_timeout: int = 300):
        self.api, self.store, self.kind = api, store, kind
        self.resources = tuple(resources)
        self.clock = clock
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.synced = asyncio.Event()
        self.path = "/api/v1/nodes" if kind == "nodes" else "/api/v1/pods"

    async def run(self) -> None:
        """Forever: list, then watch from the list's resourceVersion; on 410 list again."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type((KubeError, aiohttp.ClientError, asyncio.TimeoutError)),
            wait=wait_exponential_jitter(multiplier=0.5, max=30),
            before_sleep=lambda rs: log.warning(
                "%s watch failed, retrying: %s", self.kind,
                rs.outcome.exception() if rs.outcome else None),
        )
        async for attempt in retrying:
            with attempt:
                await self._list_and_watch()

    async def _list_and_watch(self) -> None:
        version = await self.relist()
        while True:
            try:
                version = await self._watch(version)
            except WatchExpired:
                log.info("%s watch expired (410 Gone); listing again", self.kind)
                version = await self.relist()

    async def relist(self) -> str:
        items, version = await self._list()
        if self.kind == "nodes":
            nodes = [to_node(_node_decoder.decode(r), self.resources) for r in items]
            self.store.replace_all(nodes, None)
        else:
            # Listed pods' binding time comes from their PodScheduled condition.
            wires = [_pod_decoder.decode(r) for r in items]
            decoded = [(w, self._decoded_pod(w, None)) for w in wires]
            self.store.replace_all(None, [p for _, p in decoded if p is not None])
            self.store.replace_gpuless((w.metadata.uid, w.metadata.name, w.spec.node_name)
                                       for w, p in decoded if p is None and w.spec.node_name)
        self.synced.set()
        log.info("listed %d %s at resourceVersion %s", len(items), self.kind, version)
        return version

    async def _list(self) -> tuple[list[msgspec.Raw], str]:
        return await list_raw(self.api, self.path, self.page_size)

    async def _watch(self, version: str) -> str:
        params = [("watch", "true"), ("resourceVersion", version),
                  ("allowWatchBookmarks", "true"), ("timeoutSeconds", self.watch_timeout)]
        resp = await raw_get(self.api, self.path, params, timeout=self.watch_timeout + 30)
        async with resp:
            if resp.status != 200:
                raise _status_error(resp.status, await resp.read(), f"watch {self.kind}")
            async for line in _lines(resp):
                version = self._apply(_event_decoder.decode(line)) or version
        return version

    def _apply(self, event: Event) -> str | None:
        if event.type == "ERROR":
            status = msgspec.json.decode(event.object, type=Status)
            if status.code == 410:
                raise WatchExpired(status.message, 410)
            raise kube_error(status.code, status.message, f"watch {self.kind}: {status.message}")
        if event.type == "BOOKMARK":
            return _node_decoder.decode(event.object).metadata.resource_version
        return self._apply_object(event)

    def _apply_object(self, event: Event) -> str:
        if self.kind == "nodes":
            return self._apply_node(event)
        return self._apply_pod(event)

    def _apply_node(self, event: Event) -> str:
        wire = _node_decoder.decode(event.object)
        if event.type == "DELETED":
            self.store.delete_node(wire.metadata.name)
        else:
            self.store.upsert_node(to_node(wire, self.resources))
        return wire.metadata.resource_version

    def _apply_pod(self, event: Event) -> str:
        wire = _pod_decoder.decode(event.object)
        pod = self._decoded_pod(wire, self.clock())
        if event.type == "DELETED" or pod is None:
            self.store.delete_pod(wire.metadata.uid)
        else:
            self.store.upsert_pod(pod)
        gone = event.type == "DELETED" or pod is not None
        self.store.note_gpuless(wire.metadata.uid, wire.metadata.name,
                                None if gone else wire.spec.node_name)
        return wire.metadata.resource_version

    def _decoded_pod(self, wire: WirePod, seen_at: float | None) -> Pod | None:
        """The pod if it holds or wants GPUs and is not finished; else None."""
        try:
            bound_at = seen_at if wire.spec.node_name else None
            pod = to_pod(wire, self.resources, bound_at=bound_at)
        except QuantityError as e:
            log.warning("pod %s/%s: ignoring unreadable GPU request: %s",
                        wire.metadata.namespace, wire.metadata.name, e)
            return None
        # A pod with DRA claims may hold GPUs through them: core/dra.py's join decides.
        if (pod.gpus <= 0 and not pod.claims) or pod.phase in ("Succeeded", "Failed"):
            return None
        return pod


async def raw_get(api: client.ApiClient, path: str, params: list[tuple[str, Any]],
                  timeout: float) -> aiohttp.ClientResponse:
    """GET with the client's auth and transport, body left unread (we decode it ourselves)."""
    return await api.call_api(
        path, "GET", query_params=params, auth_settings=["BearerToken"],
        _preload_content=False, _request_timeout=timeout,
        header_params={"Accept": "application/json"},
    )


async def list_raw(api: client.ApiClient, path: str, page_size: int = 500,
                   selectors: Sequence[tuple[str, str]] = ()) -> tuple[list[msgspec.Raw], str]:
    """Every object of a (paginated) LIST as raw JSON, and the list's resourceVersion.

    ``selectors``: query parameters such as ``("fieldSelector", "spec.nodeName=gpu-1")``."""
    items: list[msgspec.Raw] = []
    token: str | None = None
    while True:
        params: list[tuple[str, Any]] = [("limit", page_size), *selectors]
        if token:
            params.append(("continue", token))
        try:
            resp = await raw_get(api, path, params, timeout=60)
        except (aiohttp.ClientError, TimeoutError) as e:
            # gather()ed lists fail in any order: the message names the server, not the path
            raise KubeError(f"cannot reach the API server at {api.configuration.host}: "
                            f"{e or type(e).__name__}") from e
        async with resp:
            body = await resp.read()
            if resp.status != 200:
                raise _status_error(resp.status, body, f"list {path}")
        page = _list_decoder.decode(body)
        items += page.items
        token = page.metadata.continue_
        if not token:
            return items, page.metadata.resource_version


async def _lines(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """Watch events are newline-delimited; objects can exceed aiohttp's readline limit."""
    buffer = b""
    async for chunk in resp.content.iter_any():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer


def _status_error(status: int, body: bytes, what: str) -> KubeRefused:
    try:
        message = msgspec.json.decode(body, type=Status).message
    except msgspec.DecodeError:
        message = body[:200].decode(errors="replace")
    # 410: the server's message alone (the watch lists again)
    said = message if status == WatchExpired.STATUS else f"{what}: HTTP {status}: {message}"
    error = kube_error(status, message, said, message)
    if isinstance(error, KubeForbidden):
        log.error("%s forbidden: grant get/list/watch on it to this ServiceAccount (%s)",
                  what, message)
    return error
