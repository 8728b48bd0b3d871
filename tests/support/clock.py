"""A moved clock: ``datetime`` whose ``now()`` runs ``shift`` ahead, to patch into a module that
reads the time (e.g. a consumer's clock a day later)."""

from __future__ import annotations

from datetime import datetime, timedelta, tzinfo


class MovedClock(datetime):
    """``datetime`` whose now() is ``shift`` ahead."""

    shift = timedelta(0)

    @classmethod
    def now(cls, tz: tzinfo | None = None) -> MovedClock:  # type: ignore[override]
        t = datetime.now(tz) + cls.shift
        return cls.fromtimestamp(t.timestamp(), tz)
