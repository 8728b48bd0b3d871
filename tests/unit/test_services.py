"""The one lifecycle of background services (gateway.runtime.services.run): each runs until
``stop``, gets its grace to finish, is cancelled after it, and is closed in every case."""

from __future__ import annotations

import asyncio

import pytest

from gateway.core.settings import Settings
from gateway.runtime import services


class Probe:
    """A service that records what happens to it."""

    def __init__(self, name: str, log: list[str], *, grace: float | None = 1.0, finish_s: float = 0.0,
                 fail_after_s: float | None = None) -> None:
        self.name = name
        self.stop_grace_s = grace
        self.log = log
        self.finish_s = finish_s
        self.fail_after_s = fail_after_s

    async def run(self, stop: asyncio.Event) -> None:
        self.log.append(f"{self.name} run")
        try:
            if self.fail_after_s is not None:
                await asyncio.sleep(self.fail_after_s)
                raise RuntimeError(f"{self.name} broke")
            await stop.wait()
            await asyncio.sleep(self.finish_s)  # finishing what it was doing
            self.log.append(f"{self.name} finished")
        except asyncio.CancelledError:
            self.log.append(f"{self.name} cancelled")
            raise

    async def close(self) -> None:
        self.log.append(f"{self.name} closed")


async def _run_until(items: list[Probe], stop: asyncio.Event, after_s: float, **kw: object) -> list[str]:
    async def later() -> None:
        await asyncio.sleep(after_s)
        stop.set()

    setter = asyncio.create_task(later())
    failed = await services.run(items, stop, **kw)  # type: ignore[arg-type]
    setter.cancel()
    return failed


async def test_services_stop_together_and_are_closed_in_reverse_order() -> None:
    log: list[str] = []
    a, b = Probe("a", log), Probe("b", log)
    assert await _run_until([a, b], asyncio.Event(), 0.05) == []
    assert log[:2] == ["a run", "b run"]
    assert set(log[2:4]) == {"a finished", "b finished"}
    assert log[4:] == ["b closed", "a closed"]


async def test_a_service_past_its_grace_is_cancelled_and_still_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log: list[str] = []
    slow, quick = Probe("slow", log, grace=0.1, finish_s=30), Probe("quick", log)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await _run_until([slow, quick], asyncio.Event(), 0.05) == []
    assert loop.time() - started < 5  # bounded by the grace, not the 30 s it wanted
    assert "slow cancelled" in log and "quick finished" in log
    assert log[-2:] == ["quick closed", "slow closed"]
    assert "slow did not stop within" in caplog.text


async def test_a_service_that_fails_stops_the_others_through_on_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log: list[str] = []
    stop = asyncio.Event()
    broken, fine = Probe("broken", log, fail_after_s=0.02), Probe("fine", log)
    failed = await services.run([broken, fine], stop, on_failure=stop.set)  # type: ignore[list-item]
    assert failed == ["broken"]
    assert "fine finished" in log
    assert log[-2:] == ["fine closed", "broken closed"]
    assert "broken stopped on its own" in caplog.text and "RuntimeError: broken broke" in caplog.text


async def test_a_service_whose_close_fails_does_not_keep_the_others_open() -> None:
    log: list[str] = []

    class BadClose(Probe):
        async def close(self) -> None:
            raise OSError("socket already gone")

    bad, good = BadClose("bad", log), Probe("good", log)
    assert await _run_until([good, bad], asyncio.Event(), 0.02) == []
    assert log[-1] == "good closed"


def test_a_process_of_one_service_gets_its_pool_size() -> None:
    s = Settings(consumer_concurrency=6, db_pool_min=2, db_pool_max=9)
    assert not services.Roles()
    assert services.pool_size(s, services.Roles(consumers=True)) == (1, 9)  # one each, 3 to spare
    assert services.pool_size(s, services.Roles(sender=True)) == (2, 9)
    assert services.pool_size(s, services.Roles(forwarder=True)) == (1, 4)  # its rounds use their own
