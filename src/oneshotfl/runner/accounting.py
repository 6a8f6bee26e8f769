"""Client time that does not depend on the order methods ran in (the result's time columns).

A run's methods share client artefacts through the cache: the first method to need a client's
plain ERM model trains it, the others load it. Charging the training to whichever came first
would make the time columns depend on the order of ``methods``; :func:`attribute_client_time`
charges shared artefacts to no method and lists them once instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from oneshotfl.runner.results import MethodResult


def attribute_client_time(
    results: Sequence[MethodResult],
) -> tuple[list[MethodResult], list[dict[str, Any]]]:
    """Client time that does not depend on the order methods ran in.

    An artefact a client used for several methods (the plain ERM model behind ``local``,
    ``fedavg`` and ``ensemble``) is *shared*: it is charged to none of them but listed once, by
    kind, with the methods that used it and its mean seconds per client. A method's own time
    per client, ``client_own_s``, is its update's work outside artefact making (``wall −
    made``) plus the artefacts only it used, cached or not. Unknown making times (artefacts
    an older version cached) count 0.
    """
    users: dict[str, set[str]] = {}
    for r in results:
        for used in r.client_artefacts or []:
            for label in used:
                users.setdefault(label, set()).add(r.key)
    attributed: list[MethodResult] = []
    shared: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}
    for r in results:
        if r.client_artefacts is None or r.client_made_s is None:
            attributed.append(r)
            continue
        own = []
        for wall, made, used in zip(
            r.client_wall_s, r.client_made_s, r.client_artefacts, strict=True
        ):
            alone = sum(s or 0.0 for label, s in used.items() if users[label] == {r.key})
            own.append(max(0.0, wall - made) + alone)
        attributed.append(dataclasses.replace(r, client_own_s=own))
    clients = max((len(r.client_wall_s) for r in results), default=1) or 1
    for label, methods in users.items():
        if len(methods) > 1:
            seconds = next(
                (u[label] for r in results for u in r.client_artefacts or [] if label in u), None
            )
            kind = label.split(":", 1)[0]
            entry = shared.setdefault(
                (kind, tuple(sorted(methods))), {"kind": kind, "methods": sorted(methods), "s": 0.0}
            )
            entry["s"] += seconds or 0.0
    rows = [
        {"kind": e["kind"], "methods": e["methods"], "seconds_per_client": e["s"] / clients}
        for e in shared.values()
    ]
    return attributed, sorted(rows, key=lambda e: -e["seconds_per_client"])
