"""What ``oneshotfl describe NAME`` prints, as text and as a documentation page — one source.

A method is described by its module's docstring (the paper, deviations and choices), its
``requires`` declaration in words (:func:`requirement_lines`, one line per field of
:class:`~oneshotfl.protocol.contract.Requires`) and the hyper-parameters of its ``Config``
with their defaults.
:func:`describe_method` returns the text the command prints; :func:`method_page` renders the
same text as the Markdown page of the documentation site (``scripts/mkdocs_hooks.py``
generates one per registered method), and :func:`methods_table` the index of every method.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from dataclasses import dataclass

from oneshotfl.methods import METHODS
from oneshotfl.protocol.contract import Requires, Topology

LIMITS_HEADER = "known limits (the robustness matrix, docs/benchmarks.md):"

__all__ = [
    "MethodDescription",
    "describe",
    "describe_method",
    "docstring_markdown",
    "method_page",
    "methods_table",
    "requirement_lines",
]


@dataclass(frozen=True)
class MethodDescription:
    """One registered method, described.

    Attributes:
        name: the registered name.
        summary: the registry's one-line description (``oneshotfl list methods``).
        doc: the method module's docstring, cleaned (``inspect.cleandoc``).
        requirements: one line per ``Requires`` field, in words (:func:`requirement_lines`).
        settings: the ``hyper-parameters ...`` header and one line per ``Config`` field,
            ``  name = default`` (plus the effective value where the config resolves ``None``
            defaults).
        limits: one line per known limit (:mod:`oneshotfl.protocol.limits`): where the
            method is expected below training alone or the plain ensemble, and why.
    """

    name: str
    summary: str
    doc: str
    requirements: tuple[str, ...]
    settings: tuple[str, ...]
    limits: tuple[str, ...] = ()

    def text(self) -> str:
        """The text ``oneshotfl describe NAME`` prints, without the final newline."""
        limits = (LIMITS_HEADER, *self.limits) if self.limits else ()
        requires = (REQUIRES_HEADER, *(f"  {line}" for line in self.requirements))
        body = (*limits, *([""] if limits else []), *requires, *self.settings)
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
    settings = ["hyper-parameters (set as --method NAME:key=value):"]
    config = cls.Config()
    resolved = config.resolved() if hasattr(config, "resolved") else {}
    for f in dataclasses.fields(cls.Config):
        default = f.default if f.default is not dataclasses.MISSING else "(required)"
        effective = f"   (by default: {resolved[f.name]!r})" if f.name in resolved else ""
        settings.append(f"  {f.name} = {default!r}{effective}")
    limits = tuple(f"  - {limit.scope()}: {limit.why}" for limit in cls.known_limits)
    requirements = requirement_lines(cls.requires)
    return MethodDescription(name, summary, doc, requirements, tuple(settings), limits)


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
    list (``what``: words) and the hyper-parameters verbatim in a preformatted block.
    """
    d = describe(name)
    settings = "\n".join(d.settings)
    limits = "".join(f"- {line.strip()[2:]}\n" for line in d.limits)
    known = f"## Known limits\n\nFrom the robustness matrix (docs/benchmarks.md).\n\n{limits}\n"
    requires = "".join(f"- **{what}**: {words}\n" for what, words in _split(d.requirements))
    return (
        f"# {d.name}\n\n"
        f"*{d.summary}*\n\n"
        f"This page is what `oneshotfl describe {d.name}` prints.\n\n"
        f"{docstring_markdown(d.doc)}\n\n"
        f"{known if limits else ''}"
        f"## Requirements\n\n{requires}\n"
        "## Hyper-parameters\n\n"
        f"```text\n{settings}\n```\n"
    )


def _split(lines: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(what, words) for what, _, words in (line.partition(": ") for line in lines)]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def methods_table(link: str = "{name}.md") -> str:
    """A Markdown table of every registered method and its one-line description.

    Args:
        link: the link target of each name, formatted with ``name``.
    """
    rows = [
        f"| [`{e.name}`]({link.format(name=e.name)}) | {_cell(e.description)} |"
        for e in METHODS.entries()
    ]
    return "\n".join(["| method | description |", "|---|---|", *rows])
