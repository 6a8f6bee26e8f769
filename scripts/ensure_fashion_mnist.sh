#!/usr/bin/env bash
# Makes sure Fashion-MNIST's IDX files exist; installs Debian's dataset-fashion-mnist if not.
set -euo pipefail
dirs=("${ONESHOTFL_DATA:-}" /usr/share/datasets/fashion-mnist)
for d in "${dirs[@]}"; do
  if [ -n "$d" ] && [ -f "$d/train-images-idx3-ubyte.gz" ]; then exit 0; fi
done
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "data: installing Debian's dataset-fashion-mnist into /usr/share/datasets/fashion-mnist"
  apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null
  exit 0
fi
echo "data: Fashion-MNIST not found in \$ONESHOTFL_DATA or /usr/share/datasets/fashion-mnist," \
     "and this shell cannot apt-get install dataset-fashion-mnist (needs root and apt);" \
     "install that package, or put the four IDX .gz files in a folder and set ONESHOTFL_DATA." >&2
exit 1
