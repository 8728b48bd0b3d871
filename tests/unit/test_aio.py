"""gateway.core.aio.wait_set: the wait every long-running loop uses, and the cancellation it must
not swallow (the loop that never stops holds its process's exit)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.core.aio import first_set, wait_set


@pytest.mark.parametrize(
    ("set_before", "set_after_s", "seconds", "expected"),
    [
        (True, None, 5.0, True),  # set already: at once
        (False, 0.01, 5.0, True),  # set while waiting
        (False, None, 0.01, False),  # not set: the bound
        (False, 0.01, None, True),  # no bound: until set
    ],
)
async def test_wait_set(
    set_before: bool, set_after_s: float | None, seconds: float | None, expected: bool
) -> None:
    event = asyncio.Event()
    if set_before:
        event.set()
    if set_after_s is not None:
        asyncio.get_running_loop().call_later(set_after_s, event.set)
    assert await asyncio.wait_for(wait_set(event, seconds), 5) is expected


async def test_a_cancel_in_the_step_the_event_is_set_ends_the_loop() -> None:
    """The event set and the loop's task cancelled in one step of the event loop (a stop that
    sets its event and cancels, or a wake that comes as the process shuts down). With
    ``asyncio.wait_for`` on Python 3.11 the wait returned normally and the loop went on."""
    event = asyncio.Event()
    rounds = 0

    async def loop_forever() -> None:
        nonlocal rounds
        while True:
            await wait_set(event, 10.0)
            event.clear()
            rounds += 1

    task = asyncio.create_task(loop_forever())
    await asyncio.sleep(0.01)  # the task waits now
    event.set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)
    assert task.cancelled() and rounds == 0


@pytest.mark.parametrize(("set_one", "within"), [(True, 5.0), (False, 0.01)])
async def test_first_set_ends_on_an_event_or_its_bound(set_one: bool, within: float) -> None:
    a, b = asyncio.Event(), asyncio.Event()
    if set_one:
        asyncio.get_running_loop().call_later(0.01, b.set)
    await asyncio.wait_for(first_set(a, b, within=within), 2)  # neither way waits longer
    assert b.is_set() is set_one and not a.is_set()
