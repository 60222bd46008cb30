"""Deliver a notification to one webhook: gpusteward's JSON, or a Slack-compatible
incoming-webhook payload.

Slack's incoming webhooks take an HTTP POST (``Content-type: application/json``) of a JSON
object with a ``text`` field (mrkdwn) and optional layout ``blocks``, and answer 200 ``ok``;
errors are 4xx with a word such as ``invalid_payload`` or ``no_service``
(https://api.slack.com/messaging/webhooks; https://docs.slack.dev/tools/java-slack-sdk/guides/
incoming-webhooks). Mattermost and Rocket.Chat accept the same ``text`` payload.

The URL is read from its file (a mounted Secret) at each attempt, so a rotated Secret takes
effect without a restart, and it never appears in a log line or an error: it is a credential.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import msgspec

from gpusteward.adapters.errors import SettingsError
from gpusteward.core.policy import Sink
from gpusteward.core.reclaim.notice import Notice
from gpusteward.core.times import stamp

log = logging.getLogger("gpusteward.reclaimer.notify")

MAX_URL_BYTES = 4096


def read_url(sink: Sink) -> str:
    """The sink's URL; SettingsError naming the sink and file (never the content) otherwise."""
    where = f"notifications sink {sink.name!r}: urlFile {sink.url_file}"
    try:
        with open(sink.url_file, "rb") as f:
            raw = f.read(MAX_URL_BYTES + 1)
    except OSError as e:
        raise SettingsError(f"{where} cannot be read: {e.strerror} (mount the Secret holding "
                            "the webhook URL there)") from e
    try:
        url = raw.decode().strip()
    except UnicodeDecodeError:
        url = ""
    if len(raw) > MAX_URL_BYTES or not url.startswith(("https://", "http://")) or any(
            c.isspace() for c in url):
        raise SettingsError(f"{where} does not hold one http(s) URL")
    return url


def payload(notice: Notice, fmt: str) -> bytes:
    if fmt == "slack":
        return msgspec.json.encode(slack(notice))
    body = msgspec.to_builtins(notice)
    body.update(time=stamp(notice.at), workload=notice.workload,
                deadline=None if notice.deadline is None else stamp(notice.deadline))
    del body["at"]
    return msgspec.json.encode(body)


def slack(n: Notice) -> dict[str, Any]:
    head = {"warned": ":hourglass: GPUs idle, to be reclaimed",
            "reclaimed": ":recycle: GPUs reclaimed",
            "blocked": ":no_entry: Reclaim blocked by a PodDisruptionBudget",
            "restored": ":arrow_forward: Restored at its owner's request"}[n.event]
    lines = [f"*{head}*: `{n.workload}` (team {n.team}, {n.gpus} GPU(s))", n.message]
    if n.peak_percent is not None and n.window_seconds is not None:
        lines.append(f"Evidence: peak {n.peak_percent:.1f}% over {n.window_seconds:.0f}s, "
                     f"coverage {100 * (n.coverage or 0):.0f}%")
    if n.deadline is not None:
        lines.append(f"Deadline: {stamp(n.deadline)}")
    if n.snooze:
        lines.append(f"Snooze: `{n.snooze}`")
    if n.restore:
        lines.append(f"Get it back: `{n.restore}`")
    text = "\n".join(lines)
    return {"text": text, "blocks": [{"type": "section", "text": {"type": "mrkdwn",
                                                                   "text": text}}]}


class Webhooks:
    """POSTs with a per-attempt timeout; one session for all sinks."""

    def __init__(self, timeout: float) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.session: aiohttp.ClientSession | None = None

    async def send(self, sink: Sink, notice: Notice) -> str:
        """"" when the receiver took it (2xx), else why not (no URL in it)."""
        try:
            url = read_url(sink)
        except SettingsError as e:
            return str(e)
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=self.timeout)
        try:
            async with self.session.post(url, data=payload(notice, sink.format), headers={
                    "Content-Type": "application/json", "Idempotency-Key": notice.id},
                    allow_redirects=False) as resp:
                await resp.read()
                return "" if 200 <= resp.status < 300 else f"HTTP {resp.status}"
        except TimeoutError:
            return f"no answer within {self.timeout.total:g}s"
        except aiohttp.ClientError as e:
            return type(e).__name__  # its text may hold the URL

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
