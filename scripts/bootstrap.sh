#!/usr/bin/env bash
# Creates .venv with oneshotfl and its dev tools, once; re-installs when pyproject.toml changes
# or when the requested extras change.
# torch/torchvision are pinned to the builds this project is tested with (TORCH_SPEC overrides).
# ONESHOTFL_EXTRAS picks the extras (default "dev"; "dev,flower" adds the Flower adapter;
# "crosscheck" the libraries tests/test_statistics_libraries.py checks client statistics against).
#
# The installer is uv (from the package registry, into a folder of .venv) where it can be had:
# it resolves the same pins and extras as pip, from the same places (the index URLs, find-links
# and constraints of pip's own configuration, pip's best-match rule across indexes), and
# byte-compiles what it installs as pip does; on this 2-core machine it takes about a third of
# pip's time (issue 50). Where uv cannot be installed or fails, pip does the install as before.
# ONESHOTFL_INSTALLER=pip forces pip.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-"torch==2.14.1 torchvision==0.29.1"}
EXTRAS=${ONESHOTFL_EXTRAS:-dev}
INSTALLER=${ONESHOTFL_INSTALLER:-uv}
stamp=.venv/.oneshotfl-installed
installed=$(cat "$stamp" 2>/dev/null || true)
if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ] && [ "${installed:-dev}" = "$EXTRAS" ]; then
  exit 0
fi

# uv_args: pip's effective configuration (files and PIP_* variables) as uv options, one per line.
uv_args() {
  "$PYTHON" -m pip config list 2>/dev/null | "$PYTHON" -c '
import shlex, sys
opts = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
        "find-links": "--find-links", "constraint": "--constraint"}
rank = {"global": 0, "install": 1, ":env:": 2}  # pip: PIP_* over install over global
seen = {}
for line in sys.stdin:
    key, _, value = line.strip().partition("=")
    section, _, name = key.rpartition(".")
    if name in opts and value and rank.get(section, -1) >= seen.get(name, (-1, []))[0]:
        seen[name] = (rank.get(section, -1), " ".join(shlex.split(value)).split())
for name, (_, values) in seen.items():
    for value in values:
        print(opts[name]); print(value)
'
}

with_uv() {
  local tool=.venv/.uv args=()
  [ -x .venv/bin/python ] || "$PYTHON" -m venv --without-pip .venv
  if [ ! -x "$tool/bin/uv" ]; then
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --target "$tool" uv >/dev/null 2>&1 \
      || return 1
  fi
  mapfile -t args < <(uv_args)
  # shellcheck disable=SC2086
  "$tool/bin/uv" pip install --quiet --python .venv/bin/python \
    --index-strategy unsafe-best-match --compile-bytecode ${args[@]+"${args[@]}"} \
    pip $TORCH_SPEC -e ".[$EXTRAS]"
}

with_pip() {
  [ -x .venv/bin/pip ] || "$PYTHON" -m venv .venv
  # shellcheck disable=SC2086
  .venv/bin/python -m pip install --quiet --disable-pip-version-check $TORCH_SPEC
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$EXTRAS]"
  # Flower must not move torch off the pinned build.
  # shellcheck disable=SC2086
  .venv/bin/python -m pip install --quiet --disable-pip-version-check $TORCH_SPEC
}

echo "bootstrap: installing $TORCH_SPEC and oneshotfl[$EXTRAS] into .venv with $($PYTHON --version)"
if [ "$INSTALLER" = uv ] && with_uv; then
  how=uv
else
  [ "$INSTALLER" = uv ] && echo "bootstrap: uv could not be installed or failed; installing with pip (a few minutes)"
  with_pip
  how=pip
fi
# Our own modules byte-compiled too (the suite starts many processes that import them; with
# PYTHONDONTWRITEBYTECODE set, nothing else writes these files).
.venv/bin/python -m compileall -q src >/dev/null
echo "$EXTRAS" >"$stamp"
echo "bootstrap: installed with $how in ${SECONDS} s"
