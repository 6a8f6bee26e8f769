"""Paired differences over seeds that ``oneshotfl report``'s one baseline does not give.

* ``settings RESULTS KEY A B``: each method at ``KEY=B`` minus the same method at ``KEY=A`` on
  the same seed — a default decided between two settings (the step floor bounded at 50 epochs
  or not, …); the key must not change the data, so a seed is the same federation;
* ``methods RESULTS "X - Y" ...``: method X minus method Y in every setting both ran (readings
  of one method against each other, a method against the ensemble, …).

* ``times RESULTS "X / Y" ...``: X's seconds over Y's in every setting both ran, for the
  server step (``server_wall_s`` less ``authors_evaluation_s``, the seconds an authors'
  plugin spends on their code's own evaluation) and the client step (``client_wall_s_mean``,
  where the run trained the clients rather than reading them from the cache): the geometric
  mean of the per-seed ratios and its 95% interval (a t-interval on the logarithms), and
  whether its upper end is at most 1/3 (issue 51: our time at most a third of the authors').

Each reads every ``result.json`` under RESULTS, pairs by seed, and prints the mean difference
in points (or the ratio) and its 95% t-interval (:mod:`oneshotfl.intervals`) as a markdown
table.

Usage: python scripts/paired.py settings RESULTS KEY A B [--field accuracy|personal_accuracy]
       python scripts/paired.py methods RESULTS "X - Y" ["X - Y" ...] [--field …]
       python scripts/paired.py times RESULTS "X / Y" ["X / Y" ...] [--step server|client|both]
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from oneshotfl.intervals import difference_words, mean_interval, paired_difference
from oneshotfl.runner.report import setting_label, varying_keys
from oneshotfl.runner.results import iter_results

IGNORED = {"seed", "cache_dir", "device", "workers", "methods"}
"""Config keys that do not make two runs different federations."""
LABEL_KEYS = {"clients", "dataset", "group", "model", "max_train"}
"""Config keys that name a setting beside its partition, where they differ between runs."""


def identities(configs: list[dict[str, Any]], key: str) -> list[str]:
    """What two runs to pair share, per config: its values of the keys (not ``key``, the seed
    or :data:`IGNORED`) that ``oneshotfl report``'s :func:`varying_keys` finds varying, so a
    key an older result does not record separates nothing, as in the report."""
    varying = varying_keys(configs, frozenset(IGNORED | {key}))
    return [json.dumps({k: c.get(k) for k in varying}, sort_keys=True) for c in configs]


def parse_value(text: str) -> Any:
    """A command-line value as the config holds it (``50`` → 50, ``true`` → True)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def table(results: Path, key: str, a: Any, b: Any, field: str) -> str:
    found: dict[tuple[str, str, Any], dict[int, float]] = defaultdict(dict)
    docs = [doc for _, doc in iter_results(results) if doc["config"].get(key) in (a, b)]
    for doc, ident in zip(docs, identities([d["config"] for d in docs], key), strict=True):
        config = doc["config"]
        for method in doc["methods"]:
            if method.get(field) is not None:
                where = (ident, method["key"], config.get(key))
                found[where][int(config["seed"])] = 100 * float(method[field])
    rows = []
    for (ident, method, value), by_seed in sorted(found.items(), key=lambda kv: str(kv[0])):
        other = found.get((ident, method, a))
        if value != b or other is None:
            continue
        diff, seeds = paired_difference(by_seed, other)
        rows.append(f"| {method} | {len(seeds)} | {diff.bracket()} | {difference_words(diff)} |")
    if not rows:
        raise SystemExit(
            f"paired: expected runs with {key}={a!r} and {key}={b!r} under {results}, found no pair"
        )
    head = [
        f"| method | seeds | {key}={b} minus {key}={a} ({field}, points, mean [95% interval]) "
        "| reading |",
        "|---|---:|---:|---|",
    ]
    return "\n".join(head + rows)


def setting_labels(configs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each setting's label: its partition, and the :data:`LABEL_KEYS` that differ between
    the settings (``clients=20``)."""
    varying = [k for k in sorted(LABEL_KEYS) if len({str(c.get(k)) for c in configs.values()}) > 1]
    return {
        ident: " · ".join(
            [setting_label(c), *(f"{k}={c.get(k)}" for k in varying if c.get(k) is not None)]
        )
        for ident, c in configs.items()
    }


def methods_table(results: Path, pairs: list[str], field: str) -> str:
    """Per setting (the config without its seed) and pair ``X - Y``: X minus Y over seeds."""
    found: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    configs: dict[str, dict[str, Any]] = {}
    docs = [doc for _, doc in iter_results(results)]
    for doc, ident in zip(docs, identities([d["config"] for d in docs], "seed"), strict=True):
        config = doc["config"]
        configs[ident] = config
        for method in doc["methods"]:
            if method.get(field) is not None:
                found[(ident, method["key"])][int(config["seed"])] = 100 * float(method[field])
    labels = setting_labels(configs)
    rows = []
    for pair in pairs:
        x, sep, y = (part.strip() for part in pair.partition(" - "))
        if not sep:
            raise SystemExit(f"paired: expected a pair as 'X - Y', got {pair!r}")
        for ident in sorted(labels, key=lambda i: labels[i]):
            if (ident, x) in found and (ident, y) in found:
                diff, seeds = paired_difference(found[(ident, x)], found[(ident, y)])
                rows.append(
                    f"| {labels[ident]} | `{x}` − `{y}` | {len(seeds)} | {diff.bracket()} "
                    f"| {difference_words(diff)} |"
                )
    if not rows:
        raise SystemExit(f"paired: expected runs of {', '.join(pairs)} under {results}, got none")
    head = [
        f"| setting | pair | seeds | difference ({field}, points, mean [95% interval]) | reading |",
        "|---|---|---:|---:|---|",
    ]
    return "\n".join(head + rows)


def seconds(method: dict[str, Any]) -> dict[str, float]:
    """A method's measured seconds: its server step without an authors' plugin's own
    evaluation, and its clients' mean wall time (absent when read from the cache: under 1 ms)."""
    server = float(method.get("server_wall_s") or 0.0)
    server -= float((method.get("diagnostics") or {}).get("authors_evaluation_s") or 0.0)
    out = {"server": server}
    client = float(method.get("client_wall_s_mean") or 0.0)
    if client >= 1e-3:
        out["client"] = client
    return out


def times_table(
    results: Path, pairs: list[str], steps: tuple[str, ...] = ("server", "client")
) -> str:
    """Per setting and pair ``X / Y``: X's seconds over Y's, server and client step."""
    found: dict[tuple[str, str, str], dict[int, float]] = defaultdict(dict)
    configs: dict[str, dict[str, Any]] = {}
    docs = [doc for _, doc in iter_results(results)]
    for doc, ident in zip(docs, identities([d["config"] for d in docs], "seed"), strict=True):
        config = doc["config"]
        configs[ident] = config
        for method in doc["methods"]:
            for step, value in seconds(method).items():
                found[(ident, method["key"], step)][int(config["seed"])] = value
    labels = setting_labels(configs)
    rows = []
    for pair in pairs:
        x, sep, y = (part.strip() for part in pair.partition(" / "))
        if not sep:
            raise SystemExit(f"paired: expected a pair as 'X / Y', got {pair!r}")
        for ident in sorted(labels, key=lambda i: labels[i]):
            for step in steps:
                ours, theirs = found.get((ident, x, step)), found.get((ident, y, step))
                if not ours or not theirs:
                    continue
                seeds = sorted(s for s in set(ours) & set(theirs) if ours[s] > 0 < theirs[s])
                logs = mean_interval([math.log(ours[s] / theirs[s]) for s in seeds])
                shown = f"{math.exp(logs.mean):.2f}×"
                if logs.available:
                    shown += f" [{math.exp(logs.low):.2f}, {math.exp(logs.high):.2f}]"
                    verdict = "yes" if math.exp(logs.high) <= 1 / 3 else "no"
                else:
                    shown, verdict = shown + " (CI n/a)", f"n/a: {logs.reason}"
                mean_x = sum(ours[s] for s in seeds) / max(len(seeds), 1)
                mean_y = sum(theirs[s] for s in seeds) / max(len(seeds), 1)
                rows.append(
                    f"| {labels[ident]} | `{x}` / `{y}` | {step} | {len(seeds)} | {mean_x:.3g} "
                    f"| {mean_y:.3g} | {shown} | {verdict} |"
                )
    if not rows:
        raise SystemExit(f"paired: expected runs of {', '.join(pairs)} under {results}, got none")
    head = [
        "| setting | pair | step | seeds | X s (mean) | Y s (mean) | X / Y (geometric mean "
        "[95% interval]) | at most 1/3 |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    return "\n".join(head + rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    by_key = sub.add_parser("settings")
    by_key.add_argument("results", type=Path)
    by_key.add_argument("key")
    by_key.add_argument("a")
    by_key.add_argument("b")
    by_method = sub.add_parser("methods")
    by_method.add_argument("results", type=Path)
    by_method.add_argument("pairs", nargs="+")
    for each in (by_key, by_method):
        each.add_argument("--field", default="accuracy")
    by_time = sub.add_parser("times")
    by_time.add_argument("results", type=Path)
    by_time.add_argument("pairs", nargs="+")
    by_time.add_argument(
        "--step", choices=("server", "client", "both"), default="both",
        help="server: where only the server step is the authors' (a plugin on our clients)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.mode == "settings":
        a, b = parse_value(args.a), parse_value(args.b)
        print(table(args.results, args.key, a, b, args.field))
    elif args.mode == "times":
        steps = ("server", "client") if args.step == "both" else (args.step,)
        print(times_table(args.results, args.pairs, steps))
    else:
        print(methods_table(args.results, args.pairs, args.field))


if __name__ == "__main__":
    main()
