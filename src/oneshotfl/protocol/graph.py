"""Neighbour graphs for server-free (peer) methods: who receives whose message.

A :class:`Graph` holds directed ``(sender, receiver)`` edges over client ids ``0..n-1``; an
undirected link is the two edges. :func:`build_graph` makes one from a spec:

* ``complete``: every ordered pair of distinct clients.
* ``ring`` / ``ring:k=K``: clients sit on a ring in id order; each is linked both ways to the
  ``K`` nearest clients on each side (``i±1 .. i±K`` mod ``n``), so its degree is
  ``min(2K, n-1)``; with ``2K >= n-1`` this is ``complete``.
* ``random:degree=D``: a random ``D``-regular simple undirected graph, drawn by the
  Steger–Wormald pairing algorithm (repeatedly join two random free stubs of distinct,
  non-adjacent clients; restart when stuck, at most ``RANDOM_TRIES`` times), which is
  asymptotically uniform over ``D``-regular graphs (Steger & Wormald 1999; Kim & Vu 2003) and,
  unlike rejecting whole pairings, also works for larger ``D``. For ``D > (n-1)/2`` the
  ``(n-1-D)``-regular complement is drawn and complemented.
* ``file:path=F``: a JSON object ``{"edges": [[i, j], ...], "directed": false}`` (a file whose
  text starts with ``{``; ``directed`` defaults to false, an optional ``clients`` must match,
  other keys such as those of :meth:`Graph.to_dict` are ignored) or a text edge list, one
  undirected ``i j`` pair per line, ``#`` comments and blank lines ignored. Repeated pairs are
  merged. A relative path is relative to the working directory; the spec syntax splits on
  ``:``, so the path cannot contain one.

The seed is the partition seed (the graph is part of the data split); only ``random`` uses it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from oneshotfl.registry import Registry, RegistryError, parse_spec
from oneshotfl.seeding import numpy_rng

RANDOM_TRIES = 100
Pairs = set[tuple[int, int]]


@dataclass(frozen=True)
class GraphKind:
    """A registered way to build a graph: its options and ``build(options, n, seed)``."""

    options: tuple[str, ...]
    build: Callable[[dict[str, str], int, int], Pairs]


GRAPHS: Registry[GraphKind] = Registry("graph")


def register_graph(name: str, options: tuple[str, ...], description: str) -> Any:
    """Function decorator registering a graph builder under ``name``."""

    def add(build: Callable[[dict[str, str], int, int], Pairs]) -> Callable[..., Pairs]:
        GRAPHS.register(name, description)(GraphKind(options, build))
        return build

    return add


class GraphError(ValueError):
    """A graph spec, graph file or edge list that does not describe a valid graph."""


@dataclass(frozen=True)
class Graph:
    """Directed neighbour graph: client ``r`` receives the messages of ``senders(r)``.

    Attributes:
        clients: number of clients ``n``; ids are ``0..n-1``.
        edges: sorted, distinct ``(sender, receiver)`` pairs without self loops.
        spec: the spec the graph was built from.
    """

    clients: int
    edges: tuple[tuple[int, int], ...]
    spec: str = ""

    def __post_init__(self) -> None:
        _check_clients(self.clients)
        previous: tuple[int, int] | None = None
        for edge in self.edges:
            if len(edge) != 2 or not all(_is_id(c, self.clients) for c in edge):
                raise GraphError(
                    f"graph edge: expected a pair of ids in 0..{self.clients - 1}, got {edge!r}"
                )
            if edge[0] == edge[1]:
                raise GraphError(f"graph edge: expected two different clients, got {edge!r}")
            if previous is not None and edge <= previous:
                raise GraphError(
                    f"graph edges: expected sorted and distinct, got {edge!r} after {previous!r}"
                )
            previous = edge

    @cached_property
    def _neighbours(self) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        """(senders, receivers) per client; sorted because the edges are."""
        ins: list[list[int]] = [[] for _ in range(self.clients)]
        outs: list[list[int]] = [[] for _ in range(self.clients)]
        for s, r in self.edges:
            outs[s].append(r)
            ins[r].append(s)
        return [tuple(x) for x in ins], [tuple(x) for x in outs]

    def _check(self, client: int) -> int:
        if not _is_id(client, self.clients):
            raise GraphError(f"client id: expected 0..{self.clients - 1}, got {client!r}")
        return client

    def senders(self, receiver: int) -> tuple[int, ...]:
        """The sorted clients whose messages ``receiver`` gets (its in-neighbours)."""
        return self._neighbours[0][self._check(receiver)]

    def receivers(self, sender: int) -> tuple[int, ...]:
        """The sorted clients that get ``sender``'s message (its out-neighbours)."""
        return self._neighbours[1][self._check(sender)]

    def in_degree(self, client: int) -> int:
        """Number of senders of ``client``."""
        return len(self.senders(client))

    def out_degree(self, client: int) -> int:
        """Number of receivers of ``client``."""
        return len(self.receivers(client))

    @property
    def directed(self) -> bool:
        """Whether some edge lacks its reverse."""
        present = set(self.edges)
        return any((r, s) not in present for s, r in self.edges)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able summary: spec, clients, directed flag, edges and degree statistics."""
        ins, outs = ([len(x) for x in side] for side in self._neighbours)
        return {
            "spec": self.spec,
            "clients": self.clients,
            "directed": self.directed,
            "edges": [list(e) for e in self.edges],
            "degree": {
                "in_min": min(ins),
                "in_max": max(ins),
                "out_min": min(outs),
                "out_max": max(outs),
                "mean": len(self.edges) / self.clients,
            },
        }


def build_graph(spec: str, clients: int, seed: int) -> Graph:
    """Build the neighbour graph named by ``spec`` over ``clients`` clients.

    Args:
        spec: ``complete``, ``ring[:k=K]``, ``random:degree=D`` or ``file:path=F``.
        clients: number of clients (>= 1).
        seed: the partition seed; only ``random`` draws from it.

    Raises:
        GraphError: for an unknown name or option, a bad value, or an unusable file.
    """
    try:
        name, options = parse_spec(spec, "graph")
    except ValueError as err:
        raise GraphError(str(err)) from None
    try:
        kind = GRAPHS.get(name)
    except RegistryError as err:
        raise GraphError(f"graph spec {spec!r}: {err}") from None
    unknown = sorted(set(options) - set(kind.options))
    if unknown:
        known = ", ".join(kind.options) or "none"
        raise GraphError(f"graph {name!r}: expected options ({known}), got {unknown}")
    _check_clients(clients)
    return Graph(clients, tuple(sorted(kind.build(options, clients, seed))), spec)


@register_graph("complete", (), "every client receives every other client's message")
def _complete(options: dict[str, str], n: int, seed: int) -> Pairs:
    return {(i, j) for i in range(n) for j in range(n) if i != j}


@register_graph("ring", ("k",), "a ring in id order, linked to the k nearest on each side")
def _ring(options: dict[str, str], n: int, seed: int) -> Pairs:
    k = _int_option(options, "k", "ring", default="1")
    pairs = {(i, (i + s * d) % n) for i in range(n) for d in range(1, k + 1) for s in (1, -1)}
    return {(i, j) for i, j in pairs if i != j}


@register_graph("random", ("degree",), "a random degree-regular undirected graph (seeded)")
def _random(options: dict[str, str], n: int, seed: int) -> Pairs:
    return _random_regular(n, _int_option(options, "degree", "random"), seed)


@register_graph("file", ("path",), "edges from a JSON or text edge-list file")
def _file(options: dict[str, str], n: int, seed: int) -> Pairs:
    if not options.get("path"):
        raise GraphError("graph 'file': expected option path=F, got none")
    return _read_file(Path(options["path"]), n)


def _check_clients(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GraphError(f"graph clients: expected an int >= 1, got {value!r}")


def _is_id(value: object, clients: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < clients


def _int_option(options: dict[str, str], key: str, name: str, default: str = "") -> int:
    text = options.get(key, default)
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise GraphError(f"graph {name!r}: expected option {key}=<int >= 1>, got {text!r}")
    return int(text)


def _random_regular(n: int, degree: int, seed: int) -> set[tuple[int, int]]:
    if degree > n - 1:
        raise GraphError(f"graph 'random': expected degree <= clients-1 = {n - 1}, got {degree}")
    if n * degree % 2:
        raise GraphError(f"graph 'random': expected clients*degree even, got {n}*{degree}")
    rng = numpy_rng(seed, "graph", "random", degree)
    complement = degree > (n - 1) / 2
    for _ in range(RANDOM_TRIES):
        links = _pairing(n, n - 1 - degree if complement else degree, rng)
        if links is not None:
            if complement:
                links = {(i, j) for i in range(n) for j in range(i + 1, n)} - links
            return links | {(j, i) for i, j in links}
    raise GraphError(
        f"graph 'random': expected a {degree}-regular graph on {n} clients within "
        f"{RANDOM_TRIES} pairing attempts, got none"
    )


def _pairing(n: int, d: int, rng: np.random.Generator) -> set[tuple[int, int]] | None:
    """One Steger–Wormald pairing attempt: None when it gets stuck."""
    stubs = [v for v in range(n) for _ in range(d)]
    adjacent: list[set[int]] = [set() for _ in range(n)]
    while stubs:
        for _ in range(32):  # draw a random pair of stubs until it is suitable
            a, b = (int(x) for x in rng.integers(len(stubs), size=2))
            u, v = stubs[a], stubs[b]
            if a != b and u != v and v not in adjacent[u]:
                break
        else:
            rest = set(stubs)
            if not any(v not in adjacent[u] for u in rest for v in rest if u != v):
                return None
            continue
        adjacent[u].add(v)
        adjacent[v].add(u)
        for k in sorted((a, b), reverse=True):  # drop both stubs: swap with the last, pop
            stubs[k] = stubs[-1]
            stubs.pop()
    return {(u, v) for u in range(n) for v in adjacent[u] if u < v}


def _read_file(path: Path, n: int) -> set[tuple[int, int]]:
    where = f"graph file {str(path)!r}"
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise GraphError(f"{where}: expected a readable text file, got {err}") from None
    found: list[tuple[object, object, str]] = []
    directed = False
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise GraphError(f"{where}: expected valid JSON, got {err}") from None
        if not isinstance(data, dict):
            raise GraphError(f"{where}: expected a JSON object, got {type(data).__name__}")
        edges, directed = data.get("edges"), data.get("directed", False)
        if not isinstance(edges, list) or not isinstance(directed, bool):
            raise GraphError(
                f"{where}: expected an 'edges' list and a boolean 'directed', "
                f"got {type(edges).__name__} and {directed!r}"
            )
        if data.get("clients", n) != n:
            raise GraphError(f"{where}: expected {n} clients, got {data['clients']!r}")
        for k, edge in enumerate(edges):
            if not isinstance(edge, list) or len(edge) != 2:
                raise GraphError(f"{where} edge {k}: expected [i, j], got {edge!r}")
            found.append((edge[0], edge[1], f"edge {k}"))
    else:
        for number, line in enumerate(text.splitlines(), start=1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            try:
                first, second = (int(f) for f in fields)
            except ValueError:
                raise GraphError(
                    f"{where} line {number}: expected 'i j', got {line.strip()!r}"
                ) from None
            found.append((first, second, f"line {number}"))
    pairs: set[tuple[int, int]] = set()
    for i, j, at in found:
        if not (_is_id(i, n) and _is_id(j, n)):
            raise GraphError(f"{where} {at}: expected ids in 0..{n - 1}, got {i!r} {j!r}")
        if i == j:
            raise GraphError(f"{where} {at}: expected two different clients, got {i} {j}")
        pairs.update([(i, j)] if directed else [(i, j), (j, i)])
    return pairs
