"""A content-addressed cache of trained client (and server) artefacts.

An artefact is a :class:`~oneshotfl.payload.Payload` stored as safetensors under a
key that hashes everything that determines it (data fingerprint, architecture, training
config, seeds, recipe). A sweep therefore trains each client once, whichever methods use the
model. Hits and misses are logged and counted.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from oneshotfl.atomic import atomic_write_bytes
from oneshotfl.payload import Payload, WireError, decode, encode

log = logging.getLogger(__name__)

#: Bump when a change makes old artefacts wrong (e.g. a training-loop change).
CACHE_FORMAT = 1


def cache_key(parts: Mapping[str, object]) -> str:
    """A hex key for a JSON-able description of an artefact."""
    text = json.dumps({"format": CACHE_FORMAT, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Use:
    """One artefact a party used: its ``kind:key`` label, the seconds it took to make (when
    it was made, in this run or an earlier one; NaN when unknown) and whether it was made now."""

    label: str
    seconds: float
    made_now: bool


@dataclass
class CacheCounts:
    """Hits and misses, and every artefact used, shared by a store and its scoped views."""

    hits: int = 0
    misses: int = 0
    used: list[Use] = field(default_factory=list)
    from_disk: int = 0
    """Of the hits, those read from the disk cache (made by an earlier run)."""


SCAN = 256
"""The least recently used views a store looks at for one to drop, each time one is handed
out past the budget (views in use or holding an offer are passed over): bounded work."""


@dataclass
class MemoBudget:
    """The bytes the clients' in-memory memos hold together, and the most they may
    (``limit``; 0: no bound), shared by a store and its scoped views."""

    limit: int = 0
    held: int = 0


def payload_bytes(payload: Payload) -> int:
    """The bytes of a payload's arrays (what holding it in a memo costs, to within its
    scalars)."""
    return sum(int(getattr(a, "nbytes", 0)) for a in payload.arrays.values())


@dataclass
class ArtefactStore:
    """Disk cache (``root``) plus an in-memory memo; ``root=None`` keeps only the memo.

    A run hands every party a *scoped view* (:meth:`scoped`): the server's and each client's
    artefacts live under their own scope, with a memo of their own, so a context can reach
    only its own party's artefacts — never another client's trained model or embeddings.

    The clients' memos are bounded together (``budget``): when they hold more than
    ``budget.limit`` bytes, the views of the clients used least recently are dropped as a
    new one is handed out (never one a context still holds, nor one holding an artefact
    offered and not yet taken): what
    they made stays on disk, and without a disk cache a later method that needs it makes it
    again — the same bits, more time.

    Attributes:
        root: cache directory, or ``None`` for no disk cache.
        scope: the party this view belongs to ("" for the run's own, e.g. a shared encoder).
        counts: hits and misses over every view of the run.
        budget: the bytes the clients' memos hold and may hold, over every view of the run.
    """

    root: Path | None = None
    scope: str = ""
    counts: CacheCounts = field(default_factory=CacheCounts)
    budget: MemoBudget = field(default_factory=MemoBudget)
    _held: int = field(default=0, repr=False)
    _memo: dict[str, Payload] = field(default_factory=dict, repr=False)
    _seconds: dict[str, float] = field(default_factory=dict, repr=False)
    _views: dict[str, ArtefactStore] = field(default_factory=dict, repr=False)
    _offered: dict[str, tuple[Payload, float]] = field(default_factory=dict, repr=False)
    _public_memo: dict[str, Payload] = field(default_factory=dict, repr=False)
    _public_seconds: dict[str, float] = field(default_factory=dict, repr=False)

    @property
    def hits(self) -> int:
        """Artefacts found (disk or memory), over every view."""
        return self.counts.hits

    @property
    def misses(self) -> int:
        """Artefacts computed, over every view."""
        return self.counts.misses

    def scoped(self, scope: str) -> ArtefactStore:
        """The view of party ``scope`` (the same object on every call): same disk root and
        counts, its own keys and memo, and no route back to this store or other views."""
        view = self._views.pop(scope, None)
        if view is None:
            view = ArtefactStore(
                self.root,
                scope,
                self.counts,
                self.budget,
                _public_memo=self._public_memo,
                _public_seconds=self._public_seconds,
            )
        self._views[scope] = view  # the most recently used last
        self._bound()
        return view

    def _bound(self) -> None:
        """Drop the least recently used clients' views while their memos hold more than
        the budget, among the :data:`SCAN` least recently used (the newest view, views a
        context still holds and views holding an offered artefact stay)."""
        budget = self.budget
        if not budget.limit or budget.held <= budget.limit:
            return
        newest = next(reversed(self._views))
        for scope in list(itertools.islice(self._views, SCAN)):  # the least recently used
            view = self._views[scope]
            if scope == newest:
                continue
            # held here, by this loop and by getrefcount alone: no context is using it
            in_use = sys.getrefcount(view) > 3
            if not scope.startswith("client ") or not view._held or view._offered or in_use:
                continue
            self.forget(scope)
            if budget.held <= budget.limit:
                return

    def public(self) -> ArtefactStore:
        """A view for public artefacts, those computed from public data and the seed alone
        (an autoencoder pretrained on the public pool): the run's own scope on the same disk
        root and counts, with one memo shared by this store and every view it hands out, so
        a party finds in memory (or on disk) what another party computed first — once a
        process, not once a party. Nothing private is kept under it, and the memo is a plain
        mapping: no view reaches another party's store through it."""
        memo, seconds = self._public_memo, self._public_seconds
        return ArtefactStore(
            self.root,
            "",
            self.counts,
            _memo=memo,
            _seconds=seconds,
            _public_memo=memo,
            _public_seconds=seconds,
        )

    def forget(self, scope: str) -> None:
        """Drop party ``scope``'s view and its memo (what it made stays on disk, when there
        is a disk cache): a process that plays many clients holds a bounded number."""
        view = self._views.pop(scope, None)
        if view is not None:  # a context still holding it counts against a budget of its own
            self.budget.held -= view._held
            view._held, view.budget = 0, MemoBudget()

    def _keep(self, key: str, payload: Payload) -> None:
        """Hold ``payload`` in this view's memo (a client's counts against the budget)."""
        self._memo[key] = payload
        if self.scope.startswith("client "):
            size = payload_bytes(payload)
            self._held += size
            self.budget.held += size

    def get_or_make(
        self, kind: str, parts: Mapping[str, object], make: Callable[[], Payload], label: str
    ) -> tuple[Payload, bool]:
        """The artefact keyed by ``parts``, computed by ``make()`` on a miss.

        Returns:
            ``(payload, hit)``.
        """
        key = cache_key({"kind": kind, "scope": self.scope, **parts})
        use = f"{kind}:{key[:12]}"
        if key in self._memo:
            self.counts.hits += 1
            self.counts.used.append(Use(use, self._seconds.get(key, math.nan), False))
            return self._memo[key], True
        cached = self._read(kind, key, label)
        if cached is not None:
            self.counts.hits += 1
            self.counts.from_disk += 1
            log.info("cache hit: %s (%s %s)", label, kind, key[:12])
            self._keep(key, cached)
            self._seconds[key] = self._read_seconds(kind, key)
            self.counts.used.append(Use(use, self._seconds[key], False))
            return cached, True
        self.counts.misses += 1
        if key in self._offered:  # made beforehand for this party (several clients at once)
            payload, self._seconds[key] = self._offered.pop(key)
        else:
            start = time.perf_counter()
            payload = make()
            self._seconds[key] = time.perf_counter() - start
        self._write(kind, key, payload)
        self._keep(key, payload)
        self.counts.used.append(Use(use, self._seconds[key], True))
        return payload, False

    def has(self, kind: str, parts: Mapping[str, object]) -> bool:
        """Whether :meth:`get_or_make` would find the artefact (in memory, on disk or
        offered) without making it."""
        key = cache_key({"kind": kind, "scope": self.scope, **parts})
        path = self._path(kind, key)
        return key in self._memo or key in self._offered or (path is not None and path.exists())

    def offer(
        self, kind: str, parts: Mapping[str, object], payload: Payload, seconds: float
    ) -> None:
        """Hand in an artefact made elsewhere for this party (a model trained together with
        other clients' models): the next :meth:`get_or_make` of it takes it as made now, in
        ``seconds`` — the party's share of the work — instead of calling ``make``."""
        key = cache_key({"kind": kind, "scope": self.scope, **parts})
        self._offered[key] = (payload, seconds)

    def memo(
        self, kind: str, parts: Mapping[str, object], make: Callable[[], Payload]
    ) -> tuple[Payload, bool]:
        """Like :meth:`get_or_make`, in memory only: for cheap derived facts (evaluations)
        that are not worth a file and do not count as cache hits or misses."""
        key = cache_key({"kind": kind, "memo": True, **parts})
        if key in self._memo:
            return self._memo[key], True
        payload = make()
        self._keep(key, payload)
        return payload, False

    def _path(self, kind: str, key: str) -> Path | None:
        return None if self.root is None else self.root / kind / key[:2] / f"{key}.safetensors"

    def _read(self, kind: str, key: str, label: str) -> Payload | None:
        path = self._path(kind, key)
        if path is None or not path.exists():
            return None
        try:
            return decode(path.read_bytes())
        except (OSError, WireError) as exc:
            log.warning("ignoring unreadable cache file %s for %s: %s", path, label, exc)
            return None

    def _write(self, kind: str, key: str, payload: Payload) -> None:
        path = self._path(kind, key)
        if path is None:
            return
        seconds = path.with_suffix(".seconds")  # how long it took to make, beside it
        atomic_write_bytes(seconds, f"{self._seconds.get(key, math.nan)!r}\n".encode())
        atomic_write_bytes(path, encode(payload))

    def _read_seconds(self, kind: str, key: str) -> float:
        path = self._path(kind, key)
        try:
            return float(path.with_suffix(".seconds").read_text()) if path else math.nan
        except (OSError, ValueError):
            return math.nan
