"""How far a prepare run is: the :class:`Progress` a user's callback gets, and the reporter that
calls it at most every few seconds."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    """How far a prepare run is: ``stage`` is ``"read"`` (input files) or ``"write"`` (rows)."""

    stage: str
    done: int
    total: int
    elapsed: float
    rows: int

    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.total if self.total else 100.0

    @property
    def rows_per_sec(self) -> float:
        return self.rows / self.elapsed if self.elapsed > 0 else 0.0

    def describe(self) -> str:
        unit = "files" if self.stage == "read" else "rows"
        return (f"prepare {self.stage}: {self.done}/{self.total} {unit} ({self.percent:.1f}%), "
                f"{self.rows} rows, {self.rows_per_sec:,.0f} rows/s")


class Reporter:
    """Calls the user's progress callback at most every ``every`` seconds (and at the end)."""

    def __init__(self, callback: Callable[[Progress], None] | None, every: float) -> None:
        self.callback, self.every = callback, every
        self.stage, self.start, self.last = "", 0.0, -math.inf

    def __call__(self, stage: str, done: int, total: int, rows: int, final: bool = False) -> None:
        now = time.monotonic()
        if stage != self.stage:  # rows/s of each stage counts from the stage's start
            self.stage, self.start, self.last = stage, now, now
        if self.callback and (final or now - self.last >= self.every):
            self.last = now
            self.callback(Progress(stage, done, total, now - self.start, rows))

    def begin(self, stage: str) -> None:
        self.stage, self.start, self.last = stage, time.monotonic(), time.monotonic()


def rate(rows: int, seconds: float) -> float | None:
    return round(rows / seconds, 1) if seconds > 0 else None
