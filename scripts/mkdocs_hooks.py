"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml).

* One page per registered method, ``methods/NAME.md``, generated at build time from
  :func:`oneshotfl.cli.describe.method_page` — the text ``oneshotfl describe NAME`` prints, so the
  command and the site share one source — and appended to the "Methods" section of the nav.
* ``methods/index.md``: the marker ``<!-- methods-table -->`` becomes the table of every
  registered method and its one-line description.
* A relative link to a repository file outside ``docs/`` (a sweep YAML, a script, a result
  file) has no page on the site: it becomes its text (plus the repository path). A link whose
  target exists nowhere is left alone, so ``--strict`` still fails on it.
* Cross-reference roles left in rendered docstrings (``:func:`` before inline code) are
  dropped.
"""

from __future__ import annotations

import os
import posixpath
import re
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

from oneshotfl.cli.describe import method_page, methods_table
from oneshotfl.methods import METHODS

METHODS_SECTION = "Methods"
METHODS_DIR = "methods"
TABLE_MARKER = "<!-- methods-table -->"

_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~)")
_ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|obj|exc):(<code>)~?")


def _method_uri(name: str) -> str:
    return f"{METHODS_DIR}/{name}.md"


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Append one nav entry per registered method to the "Methods" section."""
    for item in config.nav or []:
        if isinstance(item, dict) and isinstance(item.get(METHODS_SECTION), list):
            item[METHODS_SECTION].extend({n: _method_uri(n)} for n in METHODS.names())
            return config
    raise ValueError(f"mkdocs.yml: the nav has no {METHODS_SECTION!r} section to fill")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated method pages."""
    for name in METHODS.names():
        uri = _method_uri(name)
        if files.get_file_from_path(uri) is not None:
            raise ValueError(f"docs/{uri} exists; method pages are generated, remove it")
        files.append(File.generated(config, uri, content=method_page(name)))
    return files


def _outside_link(match: re.Match[str], page_dir: str, docs_dir: str, repo: str) -> str:
    target = match.group("target")
    if "://" in target or target.startswith(("#", "/", "mailto:")):
        return match.group(0)
    path = target.split("#", 1)[0]
    if not path:
        return match.group(0)
    full = os.path.normpath(os.path.join(docs_dir, page_dir, path))
    if full.startswith(docs_dir + os.sep) or not os.path.exists(full):
        return match.group(0)  # a docs page (checked by mkdocs) or a broken link (fails)
    text = match.group("text")
    rel = os.path.relpath(full, repo).replace(os.sep, "/")
    rel += "/" if path.endswith("/") else ""
    return text if os.path.basename(full) in text else f"{text} (`{rel}`)"


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Fill the methods table; make links to repository files outside docs/ plain text."""
    if page.file.src_uri == f"{METHODS_DIR}/index.md":
        if TABLE_MARKER not in markdown:
            raise ValueError(f"docs/{METHODS_DIR}/index.md: no {TABLE_MARKER} marker")
        markdown = markdown.replace(TABLE_MARKER, methods_table())
    docs_dir = os.path.normpath(config.docs_dir)
    repo = os.path.dirname(os.path.normpath(config.config_file_path))
    page_dir = posixpath.dirname(page.file.src_uri)
    out: list[str] = []
    fenced = False
    for line in markdown.split("\n"):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        if not fenced:
            line = _LINK.sub(lambda m: _outside_link(m, page_dir, docs_dir, repo), line)
        out.append(line)
    return "\n".join(out)


def on_page_content(html: str, page: Page, **kwargs: Any) -> str:
    """Drop reStructuredText roles (``:func:`` and the like) in front of inline code."""
    return _ROLE.sub(r"\1", html)
