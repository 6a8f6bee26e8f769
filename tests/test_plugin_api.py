"""The plugin API holds: ``oneshotfl.extend`` is what ``tests/plugin_api.json`` records
under its version (every exported name with its signature; a class with its constructor,
exported bases and public members), and the documented example plugins, pinned there by a
digest of their code, import from it alone and run unchanged. A difference fails in one line
saying what to do (``docs/plugins.md``, "The plugin API"): raise ``PLUGIN_API_VERSION``, name
the new version in ``CHANGELOG.md`` and re-record::

    OMP_NUM_THREADS=1 .venv/bin/python tests/test_plugin_api.py --record
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import hashlib
import inspect
import json
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oneshotfl import extend

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "tests" / "plugin_api.json"
CHANGELOG = ROOT / "CHANGELOG.md"
RECORD = "OMP_NUM_THREADS=1 .venv/bin/python tests/test_plugin_api.py --record"
WALKTHROUGH = "docs/plugins.md#your-own-method-end-to-end"
TOYS = "tests/toys.py"
_INTERNAL = re.compile(r"\boneshotfl(\.\w+)*\.(?=\w)")  # where a name lives is not the API
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")

# --------------------------------------------------------------------------- the live surface


def _text(value: object) -> str:
    return _ADDRESS.sub("", _INTERNAL.sub("", str(value)))


def _signature(obj: Any) -> str:
    try:
        return _text(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _member(owner: type, name: str, value: Any) -> str:
    """What a class member is to a plugin: its kind and signature (an attribute: its
    declared type)."""
    if isinstance(value, staticmethod | classmethod):
        return f"{type(value).__name__} {_signature(value.__func__)}"
    if isinstance(value, property | functools.cached_property):
        return "property"
    if callable(value) and not isinstance(value, type):
        abstract = " abstract" if getattr(value, "__isabstractmethod__", False) else ""
        return f"method{abstract} {_signature(value)}"
    hint = inspect.get_annotations(owner).get(name)
    return f"attribute: {_text(hint)}" if hint is not None else "attribute"


def _ours(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "oneshotfl"


def _class_entries(name: str, cls: type, exported: set[type]) -> Iterator[tuple[str, str]]:
    """The class's constructor and exported bases, and every public member it or one of its
    internal oneshotfl bases defines (an exported base's members are recorded under it)."""
    if issubclass(cls, enum.Enum):
        yield name, "enum " + ", ".join(f"{m.name}={m.value!r}" for m in cls)
        return
    bases = [b.__name__ for b in cls.__mro__[1:] if b in exported]
    if issubclass(cls, BaseException):  # what a plugin catches it as
        bases += [b.__name__ for b in cls.__mro__[1:] if b.__module__ == "builtins"][:1]
    kind = "protocol" if getattr(cls, "_is_protocol", False) else f"class {_signature(cls)}"
    yield name, kind + (f" bases {', '.join(bases)}" if bases else "")
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    seen: set[str] = set()
    for owner in cls.__mro__:
        if not _ours(owner) or (owner is not cls and owner in exported):
            continue
        for member, value in vars(owner).items():
            if member.startswith("_") or member in fields or member in seen:
                continue
            seen.add(member)
            if any(member in vars(b) for b in cls.__mro__[: cls.__mro__.index(owner)]):
                continue  # overridden lower down, by a class not recorded here
            yield f"{name}.{member}", _member(owner, member, value)


def live_surface() -> dict[str, str]:
    """Every name ``oneshotfl.extend`` exports (its version aside), as ``name`` or
    ``Class.member`` → kind and signature."""
    values = {n: getattr(extend, n) for n in extend.__all__ if n != "PLUGIN_API_VERSION"}
    exported = {v for v in values.values() if isinstance(v, type)}
    surface: dict[str, str] = {}
    for name, value in sorted(values.items()):
        if isinstance(value, type):
            surface.update(_class_entries(name, value, exported))
        elif isinstance(value, types.UnionType):
            surface[name] = "alias " + " | ".join(a.__name__ for a in value.__args__)
        elif callable(value):
            surface[name] = f"function {_signature(value)}"
        else:
            surface[name] = f"constant {value!r}"
    return surface


# --------------------------------------------------------------------------- the examples


def walkthrough_plugin() -> str:
    """The plugin file of the plugins page's walkthrough, as the page writes it."""
    page = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    section = page[page.index("## Your own method, end to end") :]
    found = re.search(r"cat > my_method\.py <<'PY'\n(.*?)\nPY\n", section, re.S)
    assert found is not None, "docs/plugins.md: expected the walkthrough's my_method.py heredoc"
    return found.group(1)


def example_sources() -> dict[str, str]:
    """The documented example plugins: the plugins page's walkthrough and the toy methods
    ``docs/adding-a-method.md`` points to."""
    return {WALKTHROUGH: walkthrough_plugin(), TOYS: (ROOT / TOYS).read_text(encoding="utf-8")}


def code_digest(source: str) -> str:
    """A digest of a module's code: its docstrings and comments do not count, nor how a
    Python version dumps its syntax tree (the code is written back by ``ast.unparse``)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        value = first.value if isinstance(first, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):  # a docstring
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return hashlib.sha256(ast.unparse(tree).encode()).hexdigest()[:16]  # stable across Pythons


def live_examples() -> dict[str, str]:
    return {where: code_digest(source) for where, source in example_sources().items()}


# --------------------------------------------------------------------------- the comparison

_DEFAULT = re.compile(r"<[^<>]*>")  # a default's repr that is no literal: <factory>, <enum …>


Parameter = tuple[str, bool]  # its code, and whether it may be left out


def _parameters(signature: str) -> tuple[list[Parameter], list[Parameter], str] | None:
    """A signature's positional parameters, its other parameters and its return, or ``None``
    where it does not read as Python."""
    code = _DEFAULT.sub(lambda m: repr(m.group(0)), signature)
    try:
        node = ast.parse(f"def f{code}: pass").body[0]
    except SyntaxError:
        return None
    assert isinstance(node, ast.FunctionDef)
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)

    def show(arg: ast.arg, default: ast.expr | None) -> Parameter:
        return ast.dump(arg) + (f" = {ast.dump(default)}" if default else ""), default is not None

    return (
        [show(a, d) for a, d in zip(positional, defaults, strict=True)],
        [show(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
        + [(f"*{ast.dump(v)}", False) for v in (args.vararg, args.kwarg) if v is not None],
        ast.dump(node.returns) if node.returns else "",
    )


def widened(old: str, new: str) -> bool:
    """Whether ``new`` only adds optional parameters to the function or constructor ``old``,
    at the end or keyword-only: no caller can tell (a method is not widened: a plugin that
    overrides it would not match)."""
    (kind, _, rest_old), (kind_new, _, rest_new) = old.partition(" "), new.partition(" ")
    if kind != kind_new or kind not in ("function", "class"):
        return False
    (sig_old, _, tail_old), (sig_new, _, tail_new) = (r.partition(" bases ") for r in
                                                      (rest_old, rest_new))  # fmt: skip
    was, now = _parameters(sig_old), _parameters(sig_new)
    if tail_old != tail_new or was is None or now is None or was[2] != now[2]:
        return False
    extra = now[0][len(was[0]) :] + [p for p in now[1] if p not in was[1]]
    return (
        now[0][: len(was[0])] == was[0]
        and set(was[1]) <= set(now[1])
        and all(optional for _, optional in extra)
    )


@dataclasses.dataclass
class Diff:
    """How the live surface differs from the manifest, by name (``Class.member``)."""

    removed: list[str]
    changed: list[str]  # a caller or an overriding plugin can tell
    widened: list[str]  # new optional parameters only
    added: list[str]
    examples: list[str]  # documented example plugins whose code changed

    def __bool__(self) -> bool:
        return any(dataclasses.astuple(self))

    @property
    def breaking(self) -> bool:
        return bool(self.removed or self.changed)


def differences(
    recorded: dict[str, Any], surface: dict[str, str], examples: dict[str, str]
) -> Diff:
    """How ``surface`` and ``examples`` differ from the manifest ``recorded``."""
    was, now = recorded["surface"], surface
    both = sorted(k for k in set(was) & set(now) if was[k] != now[k])
    old, new = recorded["examples"], examples
    return Diff(
        removed=sorted(set(was) - set(now)),
        changed=[k for k in both if not widened(was[k], now[k])],
        widened=[k for k in both if widened(was[k], now[k])],
        added=sorted(set(now) - set(was)),
        examples=sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k)),
    )


def _numbers(version: str) -> tuple[int, int]:
    major, minor = (int(p) for p in version.split("."))
    return major, minor


def bump(version: str, breaking: bool) -> str:
    """The next major (``breaking``) or minor version after ``version``."""
    major, minor = _numbers(version)
    return f"{major + 1}.0" if breaking else f"{major}.{minor + 1}"


def message(version: str, diff: Diff) -> str:
    """One line: what changed, and what to do about it."""
    named = (("removed", diff.removed), ("changed", diff.changed),
             ("new optional parameters in", diff.widened), ("added", diff.added),
             ("example plugin edited:", diff.examples))  # fmt: skip
    parts = [f"{what} {', '.join(names)}" for what, names in named if names]
    want = bump(version, diff.breaking)
    return (
        f"the plugin API (oneshotfl.extend) differs from tests/plugin_api.json: "
        f"{'; '.join(parts)} — set PLUGIN_API_VERSION to {want} in src/oneshotfl/extend.py "
        "(the major version for a removal, a change, or an example plugin a change of "
        "oneshotfl made you edit; the minor one for additions), add a CHANGELOG.md line "
        f"'Plugin API {want}: what changed', and re-record: {RECORD}"
    )


def changelog_names(version: str) -> bool:
    return f"Plugin API {version}" in CHANGELOG.read_text(encoding="utf-8")


def refusal(
    recorded: dict[str, Any], version: str, surface: dict[str, str], examples: dict[str, str]
) -> str | None:
    """Why recording ``surface`` and ``examples`` under ``version`` is refused, or ``None``."""
    diff, old = differences(recorded, surface, examples), recorded["version"]
    if diff and version == old:
        return message(old, diff)
    if version != old and _numbers(version) < _numbers(old):
        return f"expected a version after the recorded {old}, got {version}"
    if diff.breaking and _numbers(version)[0] == _numbers(old)[0]:
        return f"a removal or change needs a new major version, not {version}: {message(old, diff)}"
    if version != old and not changelog_names(version):
        return f"CHANGELOG.md names no 'Plugin API {version}': add a line saying what changed"
    return None


def load_manifest() -> dict[str, Any]:
    return json.loads(MANIFEST.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- the tests


def test_the_plugin_api_is_the_recorded_one() -> None:
    recorded = load_manifest()
    diff = differences(recorded, live_surface(), live_examples())
    if diff:
        pytest.fail(message(recorded["version"], diff), pytrace=False)
    version = extend.PLUGIN_API_VERSION
    assert version == recorded["version"], (
        f"PLUGIN_API_VERSION is {version}, tests/plugin_api.json records "
        f"{recorded['version']}: re-record: {RECORD}"
    )


def test_the_changelog_names_the_plugin_api_version() -> None:
    version = extend.PLUGIN_API_VERSION
    assert changelog_names(version), (
        f"CHANGELOG.md names no 'Plugin API {version}': add a line saying what it changed"
    )


def _oneshotfl_imports(source: str) -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("oneshotfl"):
            found.append((node.module or "", [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("oneshotfl")]
    return found


def test_the_example_plugins_import_only_from_the_plugin_api() -> None:
    for where, source in example_sources().items():
        imports = _oneshotfl_imports(source)
        assert imports, f"{where}: expected imports from oneshotfl.extend"
        for module, names in imports:
            assert module == "oneshotfl.extend", f"{where} imports {module}: expected only extend"
            assert set(names) <= set(extend.__all__), f"{where}: {set(names) - set(extend.__all__)}"


def test_every_documented_import_from_the_plugin_api_exists() -> None:
    for page in ("plugins.md", "adding-a-method.md"):
        text = (ROOT / "docs" / page).read_text(encoding="utf-8")
        names = re.findall(r"from oneshotfl\.extend import \(?([\w, \n]+)\)?", text)
        assert names or page != "plugins.md", f"docs/{page}: expected an import from extend"
        for group in names:
            missing = {n.strip() for n in group.split(",") if n.strip()} - set(extend.__all__)
            assert not missing, f"docs/{page} imports {sorted(missing)} from oneshotfl.extend"


def test_a_difference_is_one_line_that_says_what_to_do() -> None:
    recorded = {
        "version": "1.0",
        "surface": {"Method.broadcast_spec": "method (self, dims)", "gone": "function ()",
                    "f": "function (x: 'int') -> 'int'", "C": "class (a: 'int') -> None"},
        "examples": {TOYS: "aaaa"},
    }  # fmt: skip
    surface = {
        "Method.broadcast_spec": "method (self, dims, round_index)", "new": "function ()",
        "f": "function (x: 'int', y: 'int' = 0, *, z: 'str' = 'z') -> 'int'",
        "C": "class (a: 'int', b: 'int' = <factory>) -> None",
    }  # fmt: skip
    diff = differences(recorded, surface, {TOYS: "bbbb"})
    assert diff.removed == ["gone"] and diff.added == ["new"] and diff.examples == [TOYS]
    assert diff.changed == ["Method.broadcast_spec"] and diff.widened == ["C", "f"]
    line = message("1.0", diff)
    assert "\n" not in line and "to 2.0" in line and RECORD in line and "CHANGELOG" in line
    additions = differences(recorded, {**recorded["surface"], **surface, "gone": "function ()",
                                       "Method.broadcast_spec": "method (self, dims)"},
                            {TOYS: "aaaa"})  # fmt: skip
    assert not additions.breaking and "to 1.1" in message("1.0", additions)


def test_only_new_optional_parameters_widen_a_signature() -> None:
    f = "function (x: 'int', y: 'int' = 1) -> 'int'"
    assert widened(f, "function (x: 'int', y: 'int' = 1, z: 'int' = 2) -> 'int'")
    assert widened(f, "function (x: 'int', y: 'int' = 1, *, z: 'int' = 2) -> 'int'")
    assert not widened(f, "function (x: 'int', y: 'int' = 1, z: 'int') -> 'int'")  # required
    assert not widened(f, "function (x: 'int', z: 'int' = 2, y: 'int' = 1) -> 'int'")  # moved
    assert not widened(f, "function (x: 'int', y: 'int' = 2) -> 'int'")  # another default
    assert not widened(f, "function (x: 'int', y: 'int' = 1) -> 'str'")  # another return
    assert not widened(f, "function (x: 'int', y: 'int' = 1, *rest) -> 'int'")
    method = "method (self, dims: 'WireDims') -> 'PayloadSpec'"
    assert not widened(method, "method (self, dims: 'WireDims', r: 'int' = 0) -> 'PayloadSpec'")


def test_recording_refuses_a_changed_surface_under_the_same_version() -> None:
    recorded = {"version": "1.0", "surface": {"f": "function (x)"}, "examples": {}}
    changed = {"f": "function (x, y)"}
    assert refusal(recorded, "1.0", {"f": "function (x)"}, {}) is None  # nothing changed
    assert "differs" in (refusal(recorded, "1.0", changed, {}) or "")
    assert "needs a new major version" in (refusal(recorded, "1.1", changed, {}) or "")
    assert "after the recorded 1.0" in (refusal(recorded, "0.9", {}, {}) or "")
    unnamed = refusal(recorded, "9.0", changed, {}) or ""
    assert "CHANGELOG.md names no 'Plugin API 9.0'" in unnamed


def test_a_digest_ignores_docstrings_and_comments_only() -> None:
    base = code_digest('"""Doc."""\ndef f():\n    """Doc."""\n    return 1\n')
    assert code_digest("# note\ndef f():\n    return 1  # one\n") == base
    assert code_digest("def f():\n    return 2\n") != base


# --------------------------------------------------------------------------- recording


def record(version: str) -> str | None:
    """Write the manifest of the live surface under ``version``; the refusal, if any."""
    surface, examples = live_surface(), live_examples()
    if MANIFEST.exists():
        why = refusal(load_manifest(), version, surface, examples)
        if why is not None:
            return why
    elif not changelog_names(version):
        return f"CHANGELOG.md names no 'Plugin API {version}': add a line saying what it is"
    doc = {"version": version, "re-record": RECORD, "surface": surface, "examples": examples}
    MANIFEST.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return None


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit(f"usage: {RECORD}")
    refused = record(extend.PLUGIN_API_VERSION)
    if refused:
        sys.exit(f"not recorded: {refused}")
    print(f"recorded plugin API {extend.PLUGIN_API_VERSION} in {MANIFEST.relative_to(ROOT)}")
