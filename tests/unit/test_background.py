"""The apps' background work (adapters.background): a step that raises is reported and the
next one still runs; cleanup cancels every task and waits for it."""

from __future__ import annotations

import asyncio

from gpusteward.adapters.background import every, running


async def test_a_step_that_raises_is_reported_and_the_next_step_still_runs():
    steps, crashes = [], []

    async def step() -> None:
        steps.append(len(steps))
        if len(steps) == 1:
            raise RuntimeError("first step fails")

    async with running(every(0, step, lambda: crashes.append(len(steps)))):
        while len(steps) < 3:
            await asyncio.sleep(0)
    assert crashes == [1]


async def test_waiting_first_runs_no_step_before_the_first_interval():
    steps: list[int] = []

    async def step() -> None:
        steps.append(1)

    async with running(every(3600, step, lambda: None, wait_first=True)):
        await asyncio.sleep(0)
    assert steps == []


async def test_leaving_cancels_every_task_and_waits_for_it():
    never = asyncio.Event()
    async with running(never.wait(), never.wait(), name="waiter"):
        tasks = [t for t in asyncio.all_tasks() if t.get_name() == "waiter"]
    assert len(tasks) == 2 and all(t.cancelled() for t in tasks)
