"""The README's times are what the clean clones measured (issue 50): the figures it quotes for
`bash .ci/run` and `make demo` are the range of `benchmarks/results/speed/clean-clone.txt`'s
entries for the revisions and the machine it names, and those are that machine's latest."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = re.compile(
    r"^# Fresh clone at (\w+), [^,]+, (\d+) cores, (.+), idle \(scripts/clean_clone\.sh\)$"
)
QUOTE = re.compile(
    r"From (?:a )?clean clones? of ((?:`[0-9a-f]{7,}`(?:,? (?:and )?)?)+) on a (\d+)-core (.+?),"
    r" with nothing else running.*?`bash \.ci/run`, set-up included, took"
    r" \*\*([\d,]+(?:–[\d,]+)?) s\*\*.*?"
    r"`make demo` \*\*([\d,]+(?:–[\d,]+)?) s\*\* after set-up",
    re.S,
)


@dataclass(frozen=True)
class Clone:
    rev: str
    cores: int
    cpu: str
    ci_s: int | None
    demo_s: int | None


def read_clones(text: str) -> list[Clone]:
    """The entries of a clean-clone file, in file order."""
    clones: list[Clone] = []
    head: tuple[str, int, str] | None = None
    ci = demo = None

    def close() -> None:
        if head is not None:
            clones.append(Clone(head[0], head[1], head[2], ci, demo))

    for line in text.splitlines():
        if m := HEADER.match(line):
            close()
            head, ci, demo = (m[1], int(m[2]), m[3]), None, None
        elif m := re.match(r"^ci rc=0 wall=(\d+)s$", line):
            ci = int(m[1])
        elif m := re.match(r"^demo: (\d+) s after set-up$", line):
            demo = int(m[1])
    close()
    return clones


def span(values: list[int]) -> str:
    low, high = f"{min(values):,}", f"{max(values):,}"
    return low if low == high else f"{low}–{high}"


def test_the_readme_quotes_the_latest_clean_clones_of_the_machine_it_names() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())  # one line: wrapping is free
    quote = QUOTE.search(readme)
    assert quote, "README: no 'From clean clones of `REV` on a N-core CPU, with nothing else …'"
    revs = re.findall(r"`([0-9a-f]+)`", quote[1])
    cores, cpu = int(quote[2]), quote[3]
    clones = read_clones((ROOT / "benchmarks/results/speed/clean-clone.txt").read_text())
    ours = [c for c in clones if c.cores == cores and c.cpu == cpu]
    quoted = [c for c in ours if c.rev in revs]
    assert {c.rev for c in quoted} == set(revs), f"no clean-clone entry of {revs} on {cpu}"
    assert ours[-len(quoted) :] == quoted, f"later clean clones on {cpu} than the README's {revs}"
    assert all(c.ci_s is not None and c.demo_s is not None for c in quoted), "an entry that failed"
    assert quote[4] == span([c.ci_s for c in quoted if c.ci_s is not None])
    assert quote[5] == span([c.demo_s for c in quoted if c.demo_s is not None])
    assert "may differ on another CPU" in readme


def test_the_clean_clone_reader_reads_each_entry() -> None:
    text = (
        "# Fresh clone at abc1234, 2026-11-29T03:00Z, 2 cores, AMD EPYC (family 25 model 1), idle"
        " (scripts/clean_clone.sh)\nci rc=0 wall=612s\ndemo rc=0 wall=140s\n"
        "demo: 139 s after set-up\n"
        "\n# Fresh clone at def5678, 2026-11-29T04:00Z, 2 cores, AMD EPYC (family 25 model 1), idle"
        " (scripts/clean_clone.sh)\nci rc=1 wall=300s\n"
    )
    first, second = read_clones(text)
    assert first == Clone("abc1234", 2, "AMD EPYC (family 25 model 1)", 612, 139)
    assert second == Clone("def5678", 2, "AMD EPYC (family 25 model 1)", None, None)
    assert span([612, 1_030]) == "612–1,030" and span([5, 5]) == "5"
