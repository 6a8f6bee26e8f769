"""What ``oneshotfl describe NAME`` prints, as text and as a documentation page — one source.

A method is described by its module's docstring (the paper, deviations and choices), its
``requires`` declaration in words (:func:`requirement_lines`, one line per field of
:class:`~oneshotfl.protocol.requires.Requires`) and the hyper-parameters of its ``Config``
with their defaults, each with the sentence its ``Config`` docstring's ``Attributes:`` section
gives it (:func:`oneshotfl.params.attribute_docs`: the words live there once).
:func:`describe_method` returns the text the command prints; :func:`method_page` renders the
same text as the Markdown page of the documentation site (``scripts/mkdocs_hooks.py``
generates one per registered method), and :func:`methods_table` the index of every method.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap
from dataclasses import dataclass
from typing import Any

from oneshotfl.methods import METHODS
from oneshotfl.params import attribute_docs
from oneshotfl.protocol.contract import Requires, Topology

LIMITS_HEADER = "known limits (the robustness matrix, docs/benchmarks/robustness.md):"

__all__ = [
    "Knob",
    "MethodDescription",
    "describe",
    "describe_method",
    "docstring_markdown",
    "method_page",
    "methods_table",
    "needs",
    "requirement_lines",
]


@dataclass(frozen=True)
class Knob:
    """One hyper-parameter of a method, described.

    Attributes:
        name: the field of the method's ``Config`` (``--method NAME:name=value``).
        default: its default as typed on the command line (``none``, ``true``, ``0.5``).
        effective: what a ``None`` default resolves to in a run, where the config says.
        words: what it does: the ``Attributes:`` entry of the ``Config`` docstring (or of
            the base class that declares it), as written; empty when there is none.
    """

    name: str
    default: str
    effective: str | None
    words: str

    def lines(self, width: int = 92) -> list[str]:
        """``  name = default`` and the words beneath it, for a terminal."""
        effective = f"   (by default: {self.effective})" if self.effective is not None else ""
        head = f"  {self.name} = {self.default}{effective}"
        words = textwrap.wrap(plain(self.words), width, initial_indent=" " * 6,
                              subsequent_indent=" " * 6)  # fmt: skip
        return [head, *words]


def typed(value: Any) -> str:
    """A value as it is typed after ``NAME:key=`` (``none``, ``true``, ``a,b``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple | list):
        return ",".join(typed(v) for v in value) or "none"
    return str(value)


@dataclass(frozen=True)
class MethodDescription:
    """One registered method, described.

    Attributes:
        name: the registered name.
        summary: the registry's one-line description (``oneshotfl list methods``).
        doc: the method module's docstring, cleaned (``inspect.cleandoc``).
        requirements: one line per ``Requires`` field, in words (:func:`requirement_lines`).
        settings: the ``hyper-parameters ...`` header, then per ``Config`` field
            ``  name = default`` (plus the effective value where the config resolves ``None``
            defaults) and what it does, indented beneath (:meth:`Knob.lines`).
        limits: one line per known limit (:mod:`oneshotfl.protocol.limits`): where the
            method is expected below training alone or the plain ensemble, and why.
        knobs: every hyper-parameter with its default and words.
        cost: what a run of it costs in the number of clients (``Method.cost``).
    """

    name: str
    summary: str
    doc: str
    requirements: tuple[str, ...]
    settings: tuple[str, ...]
    limits: tuple[str, ...] = ()
    knobs: tuple[Knob, ...] = ()
    cost: str = ""

    def text(self) -> str:
        """The text ``oneshotfl describe NAME`` prints, without the final newline."""
        limits = (LIMITS_HEADER, *self.limits) if self.limits else ()
        requires = (REQUIRES_HEADER, *(f"  {line}" for line in self.requirements))
        cost = (f"cost in the number of clients n: {self.cost}",) if self.cost else ()
        body = (*limits, *([""] if limits else []), *requires, *cost, *self.settings)
        return "\n".join((self.doc, "", *body))


REQUIRES_HEADER = "requires:"


def _needed(needed: bool, what: str) -> str:
    return what if needed else "not needed"


def requirement_lines(req: Requires) -> tuple[str, ...]:
    """Every field of ``req`` in words, one ``what: words`` line each (the config key that
    provides it in parentheses)."""
    if req.topology is Topology.PEER:
        topology = "peer (server-free: each client sends to its graph neighbours)"
    else:
        topology = "star (each client sends one message to the server)"
    if req.data_free:
        server = "none (data-free: it is handed no public pool, only the uploads)"
    else:
        server = "the public pool, when the federation has one"
    lines = {
        "topology": f"topology: {topology}",
        "min_clients": f"clients: at least {req.min_clients}",
        "public_data": "public pool: "
        + _needed(req.public_data, "an unlabelled one (public_size > 0)"),
        "shared_encoder": "shared encoder: "
        + _needed(req.shared_encoder, "a frozen one every party knows (encoder)"),
        "same_architecture": "client architectures: "
        + ("identical (model)" if req.same_architecture else "any mix"),
        "server_model": "server architecture: "
        + _needed(req.server_model, "configured (server_model)"),
        "data_free": f"server's data: {server}",
        "validation": "validation split: "
        + _needed(req.validation, "a private one on every client (val_fraction > 0)"),
        "images": "input: "
        + (f"{req.image_need} (tables refused)" if req.image_need else "any (images or a table)"),
    }
    said = {*lines, "image_multiple"}  # image_multiple is said with images
    missing = sorted({f.name for f in dataclasses.fields(req)} - said)
    if missing:
        raise ValueError(
            f"requirement_lines: expected words for every field, got none for {missing}"
        )
    return tuple(lines.values())


def describe(name: str) -> MethodDescription:
    """Describe the method registered under ``name``.

    Raises:
        oneshotfl.registry.RegistryError: for an unknown name (the message lists the known).
    """
    cls = METHODS.get(name)
    summary = next(e.description for e in METHODS.entries() if e.name == name)
    module = inspect.getmodule(cls)
    doc = inspect.cleandoc(module.__doc__ or "") if module else ""
    knobs = method_knobs(cls.Config)
    settings = ["hyper-parameters (set as --method NAME:key=value):"]
    settings += [line for knob in knobs for line in knob.lines()]
    limits = tuple(f"  - {limit.scope()}: {limit.why}" for limit in cls.known_limits)
    requirements = requirement_lines(cls.requires)
    return MethodDescription(
        name, summary, doc, requirements, tuple(settings), limits, tuple(knobs), cls.cost
    )


def method_knobs(config_cls: type) -> list[Knob]:
    """Every field of a method's ``Config``: its default, the value a ``None`` default
    resolves to, and its words (:func:`oneshotfl.params.attribute_docs`)."""
    config = config_cls()
    resolved = config.resolved() if hasattr(config, "resolved") else {}
    words = attribute_docs(config_cls)
    knobs = []
    for f in dataclasses.fields(config_cls):
        default = typed(f.default) if f.default is not dataclasses.MISSING else "(required)"
        effective = typed(resolved[f.name]) if f.name in resolved else None
        knobs.append(Knob(f.name, default, effective, words.get(f.name, "")))
    return knobs


def describe_method(name: str) -> str:
    """The text ``oneshotfl describe NAME`` prints (without the final newline).

    The method module's docstring, a blank line, its known limits, ``requires:`` with one
    line per requirement in words, then the hyper-parameters of its ``Config`` with their
    defaults, one per line.

    Args:
        name: a registered method name (``oneshotfl list methods``).

    Raises:
        oneshotfl.registry.RegistryError: for an unknown name.
    """
    return describe(name).text()


_ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|obj|exc):`(~?)([^`]+)`")
_TABLE_RULE = re.compile(r"^=+(?:[ ]+=+)+[ ]*$")


def _role(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


def plain(text: str) -> str:
    """Docstring prose for a terminal: roles become their target, literals lose their
    backticks (``:class:`~a.B``` → ``B``)."""
    return _ROLE.sub(_role, text).replace("``", "").replace("`", "")


def docstring_markdown(doc: str) -> str:
    """Render a docstring (reStructuredText-flavoured prose) as Markdown.

    The prose reads as Markdown already (paragraphs, ``*`` and ``1.`` lists, ``**bold**``,
    double-backtick literals); cross-reference roles such as ``:func:`~a.b``` become inline
    code (``b``), and a simple reStructuredText table (``====  ====`` rules) becomes a
    preformatted block, exactly as typed.
    """
    out: list[str] = []
    rules = 0
    for line in doc.splitlines():
        if _TABLE_RULE.match(line):
            if rules == 0:
                out.append("```text")
            out.append(line)
            rules += 1
            if rules == 3:
                out.append("```")
                rules = 0
        elif rules:
            out.append(line)
        else:
            out.append(_ROLE.sub(_role, line))
    if rules:
        out.append("```")
    return "\n".join(out)


def method_page(name: str) -> str:
    """The documentation page of one method: :func:`describe_method`'s text as Markdown.

    The docstring is rendered by :func:`docstring_markdown`; the requirements follow as a
    list (``what``: words) and the hyper-parameters as a table: each one's default and what it
    does.
    """
    d = describe(name)
    limits = "".join(f"- {line.strip()[2:]}\n" for line in d.limits)
    matrix = "[robustness matrix](../benchmarks/robustness.md)"
    known = f"## Known limits\n\nFrom the {matrix}.\n\n{limits}\n"
    requires = "".join(f"- **{what}**: {words}\n" for what, words in _split(d.requirements))
    return (
        f"# {d.name}\n\n"
        f"*{d.summary}*\n\n"
        f"This page is what `oneshotfl describe {d.name}` prints.\n\n"
        f"{docstring_markdown(d.doc)}\n\n"
        f"{known if limits else ''}"
        f"## Requirements\n\n{requires}\n"
        f"## Cost in the number of clients\n\n{d.cost}\n\n"
        f"## Hyper-parameters\n\nSet as `--method {d.name}:key=value`.\n\n"
        f"{knobs_table(d.knobs) if d.knobs else 'None.'}\n"
    )


def knobs_table(knobs: tuple[Knob, ...]) -> str:
    """A Markdown table of hyper-parameters: name, default (and what ``none`` resolves to),
    what it does."""
    rows = ["| knob | default | what it does |", "|---|---|---|"]
    for k in knobs:
        default = f"`{k.default}`" + (f" (by default `{k.effective}`)" if k.effective else "")
        words = _cell(docstring_markdown(k.words)) if k.words else "—"
        rows.append(f"| `{k.name}` | {_cell(default)} | {words} |")
    return "\n".join(rows)


def _split(lines: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(what, words) for what, _, words in (line.partition(": ") for line in lines)]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def needs(req: Requires) -> str:
    """What a method needs beyond clients with data, in a few words (``—``: nothing)."""
    words = [
        "graph neighbours (no server)" if req.topology is Topology.PEER else "",
        "public pool" if req.public_data else "",
        "server model" if req.server_model else "",
        "shared encoder" if req.shared_encoder else "",
        "identical client models" if req.same_architecture else "",
        "validation split" if req.validation else "",
        f"images (side ≥ {req.images})" if req.images else "",
        f"≥ {req.min_clients} clients" if req.min_clients > 1 else "",
        "(data-free: the server gets no data)" if req.data_free else "",
    ]
    return ", ".join(w for w in words if w) or "—"


def methods_table(link: str = "{name}.md") -> str:
    """A Markdown table of every registered method, what it needs (:func:`needs`) and its
    one-line description.

    Args:
        link: the link target of each name, formatted with ``name``.
    """
    rows = [
        f"| [`{e.name}`]({link.format(name=e.name)}) | {_cell(needs(METHODS.get(e.name).requires))}"
        f" | {_cell(e.description)} |"
        for e in METHODS.entries()
    ]
    return "\n".join(["| method | needs | description |", "|---|---|---|", *rows])
