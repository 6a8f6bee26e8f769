"""Check the documentation site in a headless browser, opened from disk and served (issue 36).

Builds the site strictly (``mkdocs build --strict``), serves it on localhost (Python's
``http.server``) and starts headless Chromium with its DevTools protocol. From each of the two
roots — ``file://…/site/index.html`` and ``http://127.0.0.1:PORT/index.html`` — it opens every
page the navigation links to (following the navigation of every page it opens) and fails when
one is a folder's listing, an error or 404 page, or not a documentation page. On each root it
also types a query into the search box (from disk that needs the offline plugin's search
index), and it counts the tables that still scroll sideways in a 1280-pixel window. A short
record goes to ``benchmarks/results/docs/site-check.txt``.

Usage: ``python scripts/check_site.py [--no-build] [--site DIR] [--chromium PATH]
[--record FILE]``; exit status 1 when a page fails. Needs Chromium (Debian: ``apt-get install
chromium``) and the ``websockets`` package (installed with the ``flower`` extra).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import http.server
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUERY = "fedavg"
WIDTH, HEIGHT = 1280, 900
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
    f"--window-size={WIDTH},{HEIGHT}",
)

PAGE_FACTS = """(() => {
  const title = document.title;
  const text = document.body ? document.body.innerText.slice(0, 300) : "";
  const wraps = Array.from(document.querySelectorAll(".md-typeset__scrollwrap"));
  return {
    url: location.href.split("#")[0],
    title: title,
    listing: !!document.querySelector("#parentDirLinkBox") || /^Index of /.test(title)
      || /^Directory listing for/.test(title),
    error: /^(Error response|404)/.test(title) || /File not found|Error code: 404/.test(text),
    article: !!document.querySelector("article.md-content__inner h1"),
    nav: Array.from(document.querySelectorAll("nav.md-nav--primary a.md-nav__link[href]"))
      .map(a => a.href.split("#")[0]),
    tables: wraps.length,
    wide: wraps.filter(w => w.scrollWidth > w.clientWidth + 1).length,
  };
})()"""

SEARCH = """(async () => {
  const input = document.querySelector("input.md-search__input");
  if (!input) return {results: 0, why: "no search box"};
  // open the search as a click on its button does: from disk the index loads only then
  const toggle = document.querySelector("[data-md-toggle=search]");
  if (toggle && !toggle.checked) toggle.click();
  input.focus();
  input.value = %s;
  for (const kind of ["focus", "input", "keyup"]) {
    input.dispatchEvent(new Event(kind, {bubbles: true}));
  }
  for (let i = 0; i < 50; i++) {
    await new Promise(r => setTimeout(r, 200));
    const n = document.querySelectorAll(".md-search-result__item").length;
    if (n) return {results: n, why: ""};
  }
  const meta = document.querySelector(".md-search-result__meta");
  return {results: 0, why: meta ? meta.textContent : "no results"};
})()"""


class Page:
    """One browser tab, driven over the DevTools protocol (a websocket)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its answer (events that arrive meanwhile are kept)."""
        ident = next(self.ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self.events.append(message)

    def open(self, url: str, timeout: float = 30.0) -> None:
        """Navigate and wait for the load event."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{url}: no load event in {timeout:.0f} s")
            self.events.append(json.loads(self.ws.recv(timeout=left)))

    def evaluate(self, expression: str, timeout: float = 30.0) -> Any:
        result = self.call(
            "Runtime.evaluate",
            timeout=timeout,
            expression=expression,
            returnByValue=True,
            awaitPromise=True,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"script failed: {result['exceptionDetails']}")
        return result["result"].get("value")


@contextlib.contextmanager
def chromium(executable: str) -> Iterator[Page]:
    """Headless Chromium with a fresh profile; yields its first tab."""
    with tempfile.TemporaryDirectory(prefix="check-site-") as profile:
        proc = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stderr is not None
            port = None
            deadline = time.monotonic() + 60
            while port is None and time.monotonic() < deadline:
                line = proc.stderr.readline()
                if not line and proc.poll() is not None:
                    raise RuntimeError(f"{executable} exited with {proc.returncode}")
                if "DevTools listening on ws://" in line:
                    port = int(line.split("ws://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
            if port is None:
                raise RuntimeError(f"{executable}: no DevTools port within 60 s")
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # drain its log
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as r:
                targets = json.load(r)
            tab = next(t for t in targets if t.get("type") == "page")
            from websockets.sync.client import connect

            with connect(tab["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
                yield Page(ws)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextlib.contextmanager
def served(site: Path) -> Iterator[str]:
    """The site on http://127.0.0.1:PORT/ for as long as the block runs."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def crawl(page: Page, root: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Open ``root + index.html``, then every navigation link under ``root`` of every page
    opened; the facts of each page and the problems found."""
    queue, seen = [root + "index.html"], set()
    facts, problems = [], []
    while queue:
        url = queue.pop(0)
        if url in seen:
            continue
        seen.add(url)
        try:
            page.open(url)
            got = page.evaluate(PAGE_FACTS)
        except (RuntimeError, TimeoutError) as exc:
            problems.append(f"{url}: {exc}")
            continue
        facts.append(got)
        where = url[len(root) :]
        if got["listing"]:
            problems.append(f"{where}: a folder's listing, not a page")
        elif got["error"]:
            problems.append(f"{where}: an error page ({got['title']!r})")
        elif not got["article"]:
            problems.append(f"{where}: no documentation article ({got['title']!r})")
        queue += [u for u in got["nav"] if u.startswith(root) and u not in seen]
    return facts, problems


def search(page: Page, root: str) -> dict[str, Any]:
    page.open(root + "index.html")
    return dict(page.evaluate(SEARCH % json.dumps(QUERY), timeout=30))


def build(site: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    subprocess.run(command, cwd=ROOT, env=env, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=ROOT / "site")
    parser.add_argument("--no-build", action="store_true", help="check the site as it is")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    parser.add_argument(
        "--record", type=Path, default=ROOT / "benchmarks" / "results" / "docs" / "site-check.txt"
    )
    args = parser.parse_args(argv)
    site = args.site.resolve()
    if not args.no_build:
        build(site)
    version = subprocess.run(
        [args.chromium, "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    lines, failed = [], False
    with chromium(args.chromium) as page, served(site) as http_root:
        roots = (
            ("from disk", site.as_uri() + "/", "file://SITE/index.html"),
            ("served", http_root, "http.server on 127.0.0.1"),
        )
        for how, root, where in roots:
            facts, problems = crawl(page, root)
            found = search(page, root)
            if not found["results"]:
                problems.append(f"search for {QUERY!r} found nothing: {found['why']}")
            wide = [f for f in facts if f["wide"]]
            tables = sum(f["tables"] for f in facts)
            lines.append(
                f"{how} ({where}): {len(facts)} pages opened through the navigation, "
                f"{len(problems)} problem(s); search {QUERY!r}: {found['results']} results; "
                f"tables scrolling sideways at {WIDTH} px: {sum(f['wide'] for f in wide)} of "
                f"{tables}"
                + (f" ({', '.join(f['url'][len(root) :] for f in wide)})" if wide else "")
            )
            lines += [f"  problem: {p}" for p in problems]
            failed = failed or bool(problems)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "docs", "mkdocs.yml", "scripts/mkdocs_hooks.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    head = (
        f"scripts/check_site.py, {datetime.date.today().isoformat()}, at {commit}"
        + (" with uncommitted docs changes" if dirty else "")
        + f"; {version}, headless, {WIDTH}x{HEIGHT}; SITE = {site}"
    )
    record = "\n".join([head, *lines, "result: " + ("FAILED" if failed else "passed")]) + "\n"
    print(record, end="")
    args.record.parent.mkdir(parents=True, exist_ok=True)
    args.record.write_text(record)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
