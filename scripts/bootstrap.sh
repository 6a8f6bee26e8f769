#!/usr/bin/env bash
# Creates .venv with oneshotfl and its dev tools, once; re-installs when pyproject.toml changes
# or when the requested extras change.
# torch/torchvision are pinned to the builds this project is tested with (TORCH_SPEC overrides).
# ONESHOTFL_EXTRAS picks the extras (default "dev"; "dev,flower" adds the Flower adapter).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-"torch==2.14.1 torchvision==0.29.1"}
EXTRAS=${ONESHOTFL_EXTRAS:-dev}
stamp=.venv/.oneshotfl-installed
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
installed=$(cat "$stamp" 2>/dev/null || true)
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "${installed:-dev}" != "$EXTRAS" ]; then
  echo "bootstrap: installing $TORCH_SPEC and oneshotfl[$EXTRAS] (a few minutes the first time)"
  # shellcheck disable=SC2086
  .venv/bin/python -m pip install --quiet --disable-pip-version-check $TORCH_SPEC
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$EXTRAS]"
  # Flower must not move torch off the pinned build.
  # shellcheck disable=SC2086
  .venv/bin/python -m pip install --quiet --disable-pip-version-check $TORCH_SPEC
  echo "$EXTRAS" >"$stamp"
fi
