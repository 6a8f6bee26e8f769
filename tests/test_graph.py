"""Neighbour graphs for peer methods: specs, random regular graphs, graph files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from oneshotfl.protocol.graph import Graph, GraphError, build_graph


def both_ways(pairs: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    return tuple(sorted({*pairs, *((j, i) for i, j in pairs)}))


def test_complete_has_every_ordered_pair() -> None:
    g = build_graph("complete", 4, seed=0)
    assert g.edges == tuple((i, j) for i in range(4) for j in range(4) if i != j)
    assert all(g.in_degree(c) == g.out_degree(c) == 3 for c in range(4))
    assert g.senders(2) == (0, 1, 3)
    assert g.receivers(0) == (1, 2, 3)
    assert build_graph("complete", 1, seed=0).edges == ()


def test_ring_k1_on_five_clients_hand_listed() -> None:
    g = build_graph("ring", 5, seed=0)
    assert g.edges == both_ways([(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)])
    assert build_graph("ring:k=1", 5, seed=0).edges == g.edges
    assert g.senders(0) == (1, 4)
    assert g.receivers(4) == (0, 3)
    assert g.spec == "ring"


def test_ring_k2_degrees_and_wraparound() -> None:
    g = build_graph("ring:k=2", 7, seed=0)
    assert all(g.in_degree(c) == g.out_degree(c) == 4 for c in range(7))
    assert g.senders(0) == (1, 2, 5, 6)


@pytest.mark.parametrize(("n", "k"), [(5, 2), (6, 3), (4, 5), (2, 1), (3, 1)])
def test_ring_with_2k_at_least_n_minus_1_is_complete(n: int, k: int) -> None:
    assert build_graph(f"ring:k={k}", n, seed=0).edges == build_graph("complete", n, 0).edges


def test_random_regular_degree_symmetry_and_seeding() -> None:
    g = build_graph("random:degree=3", 20, seed=7)
    assert all(g.in_degree(c) == g.out_degree(c) == 3 for c in range(20))
    edges = set(g.edges)
    assert all((j, i) in edges for i, j in edges)
    assert all(i != j for i, j in edges)
    assert not g.to_dict()["directed"]
    assert build_graph("random:degree=3", 20, seed=7) == g
    assert build_graph("random:degree=3", 20, seed=8).edges != g.edges


@pytest.mark.parametrize(("n", "d"), [(10, 5), (30, 6), (9, 8), (12, 11), (6, 4)])
def test_random_regular_higher_degrees(n: int, d: int) -> None:
    g = build_graph(f"random:degree={d}", n, seed=1)
    assert all(g.in_degree(c) == g.out_degree(c) == d for c in range(n))
    assert all((j, i) in set(g.edges) for i, j in g.edges)


def test_random_regular_errors() -> None:
    with pytest.raises(GraphError, match=r"clients\*degree even, got 5\*3"):
        build_graph("random:degree=3", 5, seed=0)
    with pytest.raises(GraphError, match="degree <= clients-1 = 3, got 4"):
        build_graph("random:degree=4", 4, seed=0)
    with pytest.raises(GraphError, match="degree=<int >= 1>, got '0'"):
        build_graph("random:degree=0", 4, seed=0)
    with pytest.raises(GraphError, match="degree=<int >= 1>, got ''"):
        build_graph("random", 4, seed=0)


def test_unknown_name_and_option() -> None:
    with pytest.raises(
        GraphError, match="unknown graph 'star'; expected one of: complete, file, random, ring"
    ):
        build_graph("star", 4, seed=0)
    with pytest.raises(GraphError, match=r"expected options \(k\), got \['degree'\]"):
        build_graph("ring:degree=2", 4, seed=0)
    with pytest.raises(GraphError, match="k=<int >= 1>, got 'x'"):
        build_graph("ring:k=x", 4, seed=0)
    with pytest.raises(GraphError, match="expected key=value"):
        build_graph("ring:k", 4, seed=0)
    with pytest.raises(GraphError, match="expected an int >= 1, got 0"):
        build_graph("complete", 0, seed=0)


def test_file_json_undirected_and_directed(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"edges": [[0, 1], [1, 2], [2, 1]]}))
    g = build_graph(f"file:path={path}", 3, seed=0)
    assert g.edges == both_ways([(0, 1), (1, 2)])
    path.write_text(json.dumps({"edges": [[0, 1], [1, 2], [0, 1]], "directed": True}))
    d = build_graph(f"file:path={path}", 4, seed=0)
    assert d.edges == ((0, 1), (1, 2))
    assert d.senders(1) == (0,) and d.receivers(1) == (2,) and d.senders(3) == ()
    assert d.to_dict()["directed"]


def test_file_text_edge_list(tmp_path: Path) -> None:
    path = tmp_path / "g.txt"
    path.write_text("# a triangle and a pendant\n0 1\n1 2  # inline comment\n\n2 0\n3 2\n1 0\n")
    g = build_graph(f"file:path={path}", 4, seed=0)
    assert g.edges == both_ways([(0, 1), (1, 2), (0, 2), (2, 3)])
    assert g.in_degree(2) == 3 and g.out_degree(3) == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0 1\n1 4\n", "line 2: expected ids in 0..3, got 1 4"),
        ("0 1\n\n2 2\n", "line 3: expected two different clients, got 2 2"),
        ("0 1\n1 2 3\n", "line 2: expected 'i j', got '1 2 3'"),
        ("0 x\n", "line 1: expected 'i j', got '0 x'"),
        ("-1 2\n", "line 1: expected ids in 0..3, got -1 2"),
        ('{"edges": [[0, 1], [1, 9]]}', "edge 1: expected ids in 0..3, got 1 9"),
        ('{"edges": [[0, 1, 2]]}', r"edge 0: expected \[i, j\], got \[0, 1, 2\]"),
        ('{"edges": [[true, 1]]}', "edge 0: expected ids in 0..3, got True 1"),
        ('{"edge": []}', "expected an 'edges' list"),
        ('{"edges": [], "clients": 5}', "expected 4 clients, got 5"),
        ('{"edges": [}', "expected valid JSON"),
    ],
)
def test_file_errors_name_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(GraphError, match=message):
        build_graph(f"file:path={path}", 4, seed=0)


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(GraphError, match=re.escape(f"graph file '{path}': expected a readable")):
        build_graph(f"file:path={path}", 4, seed=0)
    with pytest.raises(GraphError, match="path=F, got none"):
        build_graph("file", 4, seed=0)


def test_to_dict_round_trips_through_a_file(tmp_path: Path) -> None:
    g = build_graph("random:degree=2", 8, seed=3)
    info = g.to_dict()
    assert info["spec"] == "random:degree=2" and info["clients"] == 8
    assert info["degree"] == {"in_min": 2, "in_max": 2, "out_min": 2, "out_max": 2, "mean": 2.0}
    assert json.loads(json.dumps(info)) == info
    path = tmp_path / "g.json"
    path.write_text(json.dumps(info))
    assert build_graph(f"file:path={path}", 8, seed=0).edges == g.edges
    d = Graph(3, ((0, 1), (0, 2)), "hand")
    path.write_text(json.dumps(d.to_dict()))
    assert build_graph(f"file:path={path}", 3, seed=0).edges == d.edges
    assert d.to_dict()["degree"] == {
        "in_min": 0, "in_max": 1, "out_min": 0, "out_max": 2, "mean": 2 / 3,
    }  # fmt: skip


def test_graph_validation() -> None:
    with pytest.raises(GraphError, match=r"ids in 0..2, got \(0, 3\)"):
        Graph(3, ((0, 3),))
    with pytest.raises(GraphError, match=r"two different clients, got \(1, 1\)"):
        Graph(3, ((1, 1),))
    with pytest.raises(GraphError, match=r"sorted and distinct, got \(0, 1\) after \(0, 2\)"):
        Graph(3, ((0, 2), (0, 1)))
    with pytest.raises(GraphError, match=r"sorted and distinct, got \(0, 1\) after \(0, 1\)"):
        Graph(3, ((0, 1), (0, 1)))
    with pytest.raises(GraphError, match=r"client id: expected 0\.\.2, got 3"):
        Graph(3, ()).senders(3)
