"""Command options generated from a frozen config dataclass, so a field is declared once, in
its dataclass, with its words (the ``Attributes:`` section of its docstring), and the options
several commands share. ``run --help`` lists them in panels, each by the first clause of its
description, its default shown whole."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from oneshotfl.params import attribute_docs, literal_options
from oneshotfl.runner.config_values import SECTIONS


def field_docs(cls: type) -> dict[str, str]:
    """``name → description`` from the ``Attributes:`` sections of a dataclass and its bases
    (:func:`oneshotfl.params.attribute_docs`), literals without their double backticks."""
    return {name: text.replace("``", "") for name, text in attribute_docs(cls).items()}


_ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|obj|exc):`~?([^`]+)`")


def plain_text(doc: str) -> str:
    """Docstring text for a terminal: ``:class:`~a.B``` becomes ``B``, literals lose their
    backticks."""
    return _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1], doc).replace("``", "")


def default_text(f: dataclasses.Field[Any]) -> str:
    """A field's default as a user would type it (lists comma-separated, None as none)."""
    value = f.default if f.default is not dataclasses.MISSING else None
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    if value is None:
        return "none"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value) or "none"
    return str(value) or "none"


_CLAUSE_END = re.compile(r"[.;:] | — ")
_ASIDE = re.compile(r" \(")


def short_help(text: str, most: int = 60) -> str:
    """A field's description cut, when longer than ``most`` characters, at a clause end
    outside parentheses within them: the last ``.``, ``;``, ``:`` or dash that leaves 25
    characters, else the last opening parenthesis, else the first end of either kind. The
    whole text is in the dataclass's docs; the option help of ``run`` stays one or two lines
    a setting."""
    text = text.strip().rstrip(".")
    if len(text) <= most:
        return text
    strong = [m.start() for m in _CLAUSE_END.finditer(text) if _depth(text, m.start()) == 0]
    weak = [m.start() for m in _ASIDE.finditer(text) if _depth(text, m.start()) == 0]
    for ends in ([e for e in strong if 25 <= e <= most], [e for e in weak if 12 <= e <= most]):
        if ends:
            return text[: ends[-1]]
    later = sorted(e for e in strong + weak if e >= 12)
    return text[: later[0]] if later else text


def _depth(text: str, at: int) -> int:
    """How many parentheses are open at ``text[at]``."""
    return text[:at].count("(") - text[:at].count(")")


# Where a config field's option is listed in `run --help`: the config's sections
# (oneshotfl.runner.config_values.SECTIONS) and, for the fields outside them, this map.
HELP_PANELS = {
    "data": "Data and partition",
    "clients": "Clients",
    "server": "Server",
    "security": "Attacks (robustness studies)",
}
PANEL_OF_FIELD = {
    "methods": "Methods",
    "method_defaults": "Methods",
    "plugins": "Methods",
    "encoder": "Methods",
    "graph": "Methods",
    "grad_clip": "Clients",
    "client_threads": "Execution",
    "server_threads": "Execution",
    "workers": "Execution",
    "hold_payloads": "Execution",
    "memo_mb": "Execution",
    "device": "Execution",
    "min_clients": "Server",
    "seed": "Execution",
    "group": "Execution",
}


def help_panel(name: str) -> str:
    """The ``run --help`` panel of a config field."""
    if name in PANEL_OF_FIELD:
        return PANEL_OF_FIELD[name]
    for section, fields in SECTIONS.items():
        if name in fields.values():
            return HELP_PANELS[section]
    return "Other settings"


def _option_type(hint: Any) -> type:
    """The CLI type of a config field: its scalar type; strings for lists and choices."""
    options = literal_options(hint)
    if options is not None:
        return str
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if typing.get_origin(hint) in (typing.Union, type(int | None)) else hint
    return base if base in (int, float, bool, str) else str


def config_options(
    cls: type, names: dict[str, tuple[str, ...]] | None = None, skip: tuple[str, ...] = ()
) -> list[inspect.Parameter]:
    """One ``--field-name`` option per field of the dataclass ``cls`` (default ``None``:
    not given; a bool field is a flag), with the first clause of the field's documentation
    as help (:func:`short_help`), in its panel (:func:`help_panel`); ``names`` overrides
    option names."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    params = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind = _option_type(hints[f.name])
        choices = literal_options(hints[f.name])
        help_text = short_help(plain_text(docs.get(f.name, "")))
        # a list default wraps at its commas (a long unbroken word is cut with "…")
        default = f"default: {default_text(f).replace(',', ', ')}"
        if choices:
            default = f"{'|'.join(str(c) for c in choices if c is not None)}; {default}"
        help_text += f" ({default})"
        flag = f"--{f.name.replace('_', '-')}"
        decls = (names or {}).get(f.name, (flag,) if kind is bool else ())
        option = typer.Option(
            *decls, help=help_text, show_default=False, rich_help_panel=help_panel(f.name)
        )
        annotation = Annotated[kind | None, option]  # type: ignore[valid-type]
        params.append(
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
            )
        )
    return params


def with_options(params: list[inspect.Parameter]) -> Callable[[Callable[..., Any]], Any]:
    """Decorator: append ``params`` (from :func:`config_options`) to a command's signature;
    the command receives them in ``**options``."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        own = [
            p
            for p in inspect.signature(func, eval_str=True).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        func.__signature__ = inspect.Signature([*own, *params])  # type: ignore[attr-defined]
        func.__annotations__ = {}
        return func

    return decorate


# The help of `run`, as paragraphs (a docstring's line breaks would be kept by rich and
# wrapped again on a narrow terminal).
RUN_HELP = (
    "Run methods on one federation and write result.json, CSVs and a partition heatmap."
    "\n\nSettings come from the defaults, then the YAML file (--config), then key=value "
    "overrides of any config key (alpha=0.1 seed=1), then the options. Each option is a "
    "config key; its full description is in the ExperimentConfig reference "
    "(docs/api/runner.md). The methods: oneshotfl list methods; a method's knobs: "
    "oneshotfl describe NAME."
)

# Options several commands share.
VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="oneshotfl's own debug lines too")
]
TRACKING = "Tracking and saved models"
TrackOption = Annotated[
    list[str] | None,
    typer.Option(
        help="log to tensorboard or mlflow (repeatable; the track extra)",
        rich_help_panel=TRACKING,
    ),
]
TrackDirOption = Annotated[
    Path | None,
    typer.Option(
        help="where the stores go (default: runs/; MLflow: $MLFLOW_TRACKING_URI if set)",
        rich_help_panel=TRACKING,
    ),
]
TrackExperimentOption = Annotated[
    str | None,
    typer.Option(
        help="the experiment to log under (default: oneshotfl, or the sweep's name)",
        rich_help_panel=TRACKING,
    ),
]
SaveModelsOption = Annotated[
    bool,
    typer.Option(
        "--save-models",
        help="save each method's final model(s) in OUT/models (oneshotfl.Result.load_model)",
        rich_help_panel=TRACKING,
    ),
]
TrackRunOption = Annotated[
    str | None,
    typer.Option(
        help="the tracked run's name (default: the --out folder's)", rich_help_panel=TRACKING
    ),
]
PluginOption = Annotated[
    list[str] | None,
    typer.Option("--plugin", help="a module or .py file that registers your own entries"),
]
