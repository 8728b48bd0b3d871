"""Scenarios in Locust's vocabulary: user classes with a ``weight`` and ``@task(weight)`` methods.

In this open-model harness a "user" does not loop: at each arrival the scenario picks a
user class by weight, then one of its tasks by weight, and the task returns the delivery
to send. Pure: all randomness comes from the factory's seeded RNG.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, TypeVar

from loadtest.harness.payloads import Delivery, PayloadFactory

F = TypeVar("F", bound=Callable[..., Any])


def task(weight: int = 1) -> Callable[[F], F]:
    """Mark a method as a task picked with relative ``weight`` (as ``locust.task``)."""
    if weight < 1:
        raise ValueError("task weight must be >= 1")

    def mark(fn: F) -> F:
        fn.task_weight = weight  # type: ignore[attr-defined]
        return fn

    return mark


class WebhookUser:
    """A provider sending webhooks; subclasses define ``weight`` and ``@task`` methods."""

    weight = 1
    tenashi = False  # its deliveries are signed with the Tenashi secret

    def __init__(self, factory: PayloadFactory) -> None:
        self.f = factory

    @classmethod
    def tasks(cls) -> list[tuple[str, int]]:
        out = []
        for name in dir(cls):
            w = getattr(getattr(cls, name), "task_weight", None)
            if w is not None:
                out.append((name, int(w)))
        return sorted(out)


class MetaInboundUser(WebhookUser):
    """Customers writing to the business: inbound messages of every common type."""

    weight = 3

    @task(10)
    def text(self) -> Delivery:
        return self.f.inbound("text")

    @task(2)
    def image(self) -> Delivery:
        return self.f.inbound("image")

    @task(1)
    def document(self) -> Delivery:
        return self.f.inbound("document")

    @task(1)
    def audio(self) -> Delivery:
        return self.f.inbound("audio")

    @task(1)
    def sticker(self) -> Delivery:
        return self.f.inbound("sticker")

    @task(2)
    def interactive(self) -> Delivery:
        return self.f.inbound("interactive")

    @task(1)
    def button(self) -> Delivery:
        return self.f.inbound("button")

    @task(2)
    def reaction(self) -> Delivery:
        return self.f.inbound("reaction")

    @task(1)
    def location(self) -> Delivery:
        return self.f.inbound("location")

    @task(1)
    def contacts(self) -> Delivery:
        return self.f.inbound("contacts")


class MetaStatusUser(WebhookUser):
    """Status webhooks for our outbound messages (Meta sizes for 3x outgoing traffic)."""

    weight = 6

    @task(12)
    def lifecycle(self) -> Delivery:
        return self.f.status()

    @task(1)
    def failed(self) -> Delivery:
        return self.f.status("failed")

    @task(2)
    def group(self) -> Delivery:
        return self.f.group_status(participants=self.f.rng.randint(2, 5))


class MetaBatchUser(WebhookUser):
    """Meta batching several entries and changes into one POST."""

    weight = 1

    @task(1)
    def batched(self) -> Delivery:
        return self.f.batched(entries=self.f.rng.randint(1, 3), changes=self.f.rng.randint(1, 3))


class TenashiUser(WebhookUser):
    """Tenashi events: statuses of our sends, inbound messages, other event types."""

    weight = 1
    tenashi = True

    @task(6)
    def status(self) -> Delivery:
        return self.f.tenashi("message.status")

    @task(3)
    def received(self) -> Delivery:
        return self.f.tenashi("message.received")

    @task(1)
    def other(self) -> Delivery:
        return self.f.tenashi("number.updated")


SCENARIOS: dict[str, list[type[WebhookUser]]] = {
    "mixed": [MetaInboundUser, MetaStatusUser, MetaBatchUser, TenashiUser],
    "inbound": [MetaInboundUser],
    "statuses": [MetaStatusUser],
    "batched": [MetaBatchUser],
    "tenashi": [TenashiUser],
    "meta-text": [],  # filled below: the smallest realistic payload, for raw ingest benchmarks
    "meta-status": [],  # filled below
}


class TextOnlyUser(WebhookUser):
    @task(1)
    def text(self) -> Delivery:
        return self.f.inbound("text")


SCENARIOS["meta-text"] = [TextOnlyUser]


class StatusOnlyUser(WebhookUser):
    @task(1)
    def status(self) -> Delivery:
        return self.f.status()


# One status per POST, as Meta sends most webhooks (three per outgoing message).
SCENARIOS["meta-status"] = [StatusOnlyUser]


class Scenario:
    """Picks a user class by weight, then a task by weight; returns the task's delivery."""

    def __init__(self, users: list[type[WebhookUser]], factory: PayloadFactory) -> None:
        if not users:
            raise ValueError("a scenario needs at least one user class")
        self.rng: random.Random = factory.rng
        self._users = [u(factory) for u in users]
        self._user_weights = [u.weight for u in users]
        self._tasks = [
            ([getattr(u, name) for name, _ in u.tasks()], [w for _, w in u.tasks()]) for u in self._users
        ]
        for (fns, _), user in zip(self._tasks, users, strict=True):
            if not fns:
                raise ValueError(f"{user.__name__} has no @task methods")

    def next(self) -> Delivery:
        i = self.rng.choices(range(len(self._users)), self._user_weights)[0]
        fns, weights = self._tasks[i]
        fn: Callable[[], Delivery] = self.rng.choices(fns, weights)[0]
        return fn()


def share_weight(total: int, share: float) -> int:
    """A task weight that makes ``share`` of a user's picks, beside tasks weighing ``total``
    (Locust picks tasks by weight; the harness adds redeliveries by share)."""
    if not 0 <= share < 1:
        raise ValueError("share must be in [0, 1)")
    if share == 0:
        return 0
    return max(1, round(total * share / (1 - share)))


def users(name: str, *, tenashi: bool = True) -> list[type[WebhookUser]]:
    """The scenario's user classes; without a Tenashi secret, its Meta users only."""
    try:
        chosen = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}") from None
    if tenashi:
        return list(chosen)
    meta_only = [u for u in chosen if not u.tenashi]
    if not meta_only:
        raise ValueError(f"scenario {name!r} sends only Tenashi events: it needs a Tenashi secret")
    return meta_only


def scenario(name: str, factory: PayloadFactory, *, tenashi: bool = True) -> Scenario:
    return Scenario(users(name, tenashi=tenashi), factory)
