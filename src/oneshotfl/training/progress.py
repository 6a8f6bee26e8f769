"""Progress reporting that library code can call without knowing about the terminal.

The CLI passes a :class:`RichTracker`; tests and library users get :class:`NullTracker`. A
tracker that also has ``scalar(tag, step, value)`` (a :class:`ScalarSink`, such as the
experiment tracking of :mod:`oneshotfl.tracking`) receives the training layer's per-epoch
losses through :func:`report_scalar`; others ignore them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

Advance = Callable[[int], None]


class Tracker(Protocol):
    """Something that shows progress of named tasks."""

    def task(self, description: str, total: int) -> contextlib.AbstractContextManager[Advance]:
        """A context manager yielding ``advance(n)`` for one task of ``total`` steps."""
        ...


@runtime_checkable
class ScalarSink(Protocol):
    """A tracker that records named series of numbers (losses per epoch)."""

    def scalar(self, tag: str, step: int, value: float) -> None:
        """Record ``value`` at ``step`` of the series ``tag``."""
        ...


def report_scalar(tracker: Tracker | None, tag: str, step: int, value: float) -> None:
    """Hand one point of a series to ``tracker`` if it records series (else nothing)."""
    if isinstance(tracker, ScalarSink):
        tracker.scalar(tag, step, value)


class NullTracker:
    """Shows nothing."""

    @contextlib.contextmanager
    def task(self, description: str, total: int) -> Iterator[Advance]:
        yield lambda n: None


class RichTracker:
    """Rich progress bars on stderr; one bar per running task, removed when it ends."""

    def __init__(self, console: Console | None = None) -> None:
        self._progress = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console or Console(stderr=True),
            transient=True,
        )

    def __enter__(self) -> RichTracker:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    @contextlib.contextmanager
    def task(self, description: str, total: int) -> Iterator[Advance]:
        task_id = self._progress.add_task(description, total=total)
        try:
            yield lambda n: self._progress.advance(task_id, n)
        finally:
            self._progress.remove_task(task_id)


@contextlib.contextmanager
def shown_progress(tracker: Tracker | None, show: bool | None = None) -> Iterator[Tracker | None]:
    """The tracker a library call reports to: ``tracker`` when given; else, with ``show``
    (``None``: when stderr is a terminal or a notebook), rich bars as the command line
    shows them, removed when the call ends; else none."""
    if tracker is not None or show is False:
        yield tracker
        return
    console = Console(stderr=True)
    if show is None and not (console.is_terminal or console.is_jupyter):
        yield None
        return
    with RichTracker(console) as bars:
        yield bars
