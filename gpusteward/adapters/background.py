"""The apps' background work, run the aiohttp way: tasks started in a ``cleanup_ctx`` generator
and cancelled and awaited on cleanup, so a shutdown never leaves one running. Here, not in an
app, because the apps may not import each other."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any


async def every(seconds: float, step: Callable[[], Awaitable[object]],
                crashed: Callable[[], None], *, wait_first: bool = False) -> None:
    """Run ``step`` every ``seconds``, forever (``wait_first``: the caller already ran it once).

    A step that raises must not end the work: ``crashed`` is called inside the ``except``
    block (so its ``log.exception`` carries the traceback) and the next step goes ahead."""
    if wait_first:
        await asyncio.sleep(seconds)
    while True:
        try:
            await step()
        except Exception:
            crashed()
        await asyncio.sleep(seconds)


@contextlib.asynccontextmanager
async def running(*work: Coroutine[Any, Any, object], name: str | None = None
                  ) -> AsyncIterator[None]:
    """Each of ``work`` as a task (named ``name``) for the body's duration; then all cancelled
    and awaited, in order. A task that ended with an error raises it here."""
    tasks = [asyncio.create_task(w, name=name) for w in work]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
