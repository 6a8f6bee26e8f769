#!/usr/bin/env bash
# Packaging check (issue 16): build the wheel and install it into clean virtual environments,
# without extras and with the `flower` extra, and use the installed package from outside the
# source tree:
#   1. `python -m build --wheel` on a copy of the package's files (tracked and untracked, not
#      ignored: what a commit would ship), so the working tree gets no build/ or egg-info;
#   2. the wheel holds every file of src/oneshotfl (modules and package data such as py.typed);
#   3. a clean venv, no extras: `oneshotfl --version` (= the wheel's version), `import
#      oneshotfl` (cheap: no torch), a tiny `oneshotfl run` on digits and the same from Python;
#   4. a second clean venv with the `flower` extra: `import oneshotfl.flower.app`, torch unmoved.
# torch/torchvision are installed first at the project's pins (TORCH_SPEC, as in bootstrap.sh)
# and pinned again with the wheel, so pip never tries other builds.
# Usage: bash scripts/check_wheel.sh   (PYTHON=python3.11; KEEP=1 keeps the temporary folder)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-"torch==2.14.1 torchvision==0.29.1"}
PIP=(--quiet --disable-pip-version-check)
work=$(mktemp -d "${TMPDIR:-/tmp}/oneshotfl-wheel.XXXXXX")
if [ "${KEEP:-0}" = 1 ]; then echo "check_wheel: keeping $work"; else trap 'rm -rf "$work"' EXIT; fi
step() { echo "check_wheel: $*"; }

step "copying the package's files to $work/tree"
mkdir -p "$work/tree"
git ls-files -z --cached --others --exclude-standard -- pyproject.toml README.md 'LICENSE*' src \
  | while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done \
  | tar --null -T - -cf - | tar -xf - -C "$work/tree"

step "building the wheel"
if "$PYTHON" -c "import build" 2>/dev/null; then
  builder=$PYTHON
else
  "$PYTHON" -m venv "$work/build-venv"
  "$work/build-venv/bin/python" -m pip install "${PIP[@]}" build >"$work/build-venv.log" 2>&1 \
    || { cat "$work/build-venv.log"; exit 1; }
  builder=$work/build-venv/bin/python
fi
"$builder" -m build --wheel --outdir "$work/dist" "$work/tree" >"$work/build.log" 2>&1 \
  || { cat "$work/build.log"; exit 1; }
wheels=("$work"/dist/oneshotfl-*.whl)
wheel=${wheels[0]}
step "built $(basename "$wheel")"

step "checking the wheel holds every file of src/oneshotfl"
(cd "$work/tree" && find src/oneshotfl -type f ! -name '*.pyc' | sed 's|^src/||' | sort) \
  >"$work/expected.txt"
"$PYTHON" - "$wheel" "$work/expected.txt" <<'EOF'
import sys
import zipfile

wheel, expected = sys.argv[1], sys.argv[2]
have = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("oneshotfl/")}
want = set(open(expected).read().split())
missing, extra = sorted(want - have), sorted(have - want)
if missing or extra:
    sys.exit(f"check_wheel: wheel lacks {missing}; has unexpected {extra}")
print(f"check_wheel: {len(have)} files, package data: {sorted(n for n in have if not n.endswith('.py'))}")
EOF

# A clean venv with the pinned torch, then the wheel (extras in $2), pins repeated.
make_venv() {
  "$PYTHON" -m venv "$1"
  # shellcheck disable=SC2086
  { "$1/bin/python" -m pip install "${PIP[@]}" $TORCH_SPEC \
    && "$1/bin/python" -m pip install "${PIP[@]}" "$wheel$2" $TORCH_SPEC; } >"$1.log" 2>&1 \
    || { tail -n 50 "$1.log"; exit 1; }
}

step "installing the wheel into a clean venv (no extras)"
make_venv "$work/plain" ""
cd "$work"  # away from the source tree: only the installed package can be imported
version=$("$work/plain/bin/python" -c "import importlib.metadata as m; print(m.version('oneshotfl'))")
printed=$("$work/plain/bin/oneshotfl" --version)
[ "$printed" = "oneshotfl $version" ] || { echo "check_wheel: --version printed '$printed', wheel is $version"; exit 1; }
step "oneshotfl --version: $printed"
"$work/plain/bin/python" - "$work/plain" <<'EOF'
import sys
from importlib.resources import files

import oneshotfl

assert oneshotfl.__file__.startswith(sys.argv[1]), f"imported from {oneshotfl.__file__}"
assert "torch" not in sys.modules, "import oneshotfl imported torch"
assert files("oneshotfl").joinpath("py.typed").is_file(), "py.typed missing"
print(f"check_wheel: import oneshotfl {oneshotfl.__version__} from {oneshotfl.__file__}")
EOF
"$work/plain/bin/oneshotfl" run --dataset digits --clients 2 --model mlp --local-epochs 1 --local-steps 0 \
  --methods fedavg --device cpu --no-cache --out "$work/run" >"$work/run.log" 2>&1 \
  || { cat "$work/run.log"; exit 1; }
[ -s "$work/run/result.json" ] || { echo "check_wheel: the run wrote no result.json"; exit 1; }
"$work/plain/bin/python" - "$work/run" <<'EOF'
import sys

import oneshotfl

written = oneshotfl.Result.load(sys.argv[1])
again = oneshotfl.run(written.config, cache_dir=None)
assert again.keys == ("fedavg",) and 0 < again.accuracy["fedavg"] <= 1, again.accuracy
print(f"check_wheel: oneshotfl run and oneshotfl.run on digits: fedavg {again.accuracy['fedavg']:.3f}")
EOF

step "installing the wheel with the flower extra into another clean venv"
make_venv "$work/flower" "[flower]"
"$work/flower/bin/python" - "$TORCH_SPEC" <<'EOF'
import sys

import torch

import oneshotfl.flower.app  # noqa: F401

want = dict(s.split("==") for s in sys.argv[1].split())["torch"]
assert torch.__version__.split("+")[0] == want, f"torch {torch.__version__}, pinned {want}"
print(f"check_wheel: import oneshotfl.flower.app with torch {torch.__version__}")
EOF
cd "$repo"
step "ok: $(basename "$wheel") builds, installs and runs, with and without the flower extra"
