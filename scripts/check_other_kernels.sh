#!/usr/bin/env bash
# Other CPUs on this one (issue 34): torch (ATen), oneDNN and MKL held to lower instruction
# sets run other float kernels, as a machine without AVX-512 (or without AVX) would. For each
# setting — this machine's own kernels, AVX2, and the plainest (no SIMD) — it runs the example
# that reproduces a committed result (examples/reproduce_row.py) and, with --suite, the test
# suite (pytest, one thread per worker), and writes what they printed to
# benchmarks/results/kernels/<setting>-{example,suite}.txt.
#
#   scripts/check_other_kernels.sh [--suite]      (make check-kernels)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/kernels
mkdir -p "$OUT"
suite=${1:-}
status=0
for setting in native avx2 default; do
  case $setting in
    native) env=() ;;
    avx2) env=(ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2) ;;
    default) env=(ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2) ;;
  esac
  {
    echo "# $setting: ${env[*]:-(no limit)}; $(date -u +%Y-%m-%dT%H:%MZ); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(nproc) cores"
    echo "# command: ${env[*]} OMP_NUM_THREADS=1 .venv/bin/python examples/reproduce_row.py"
    env "${env[@]}" OMP_NUM_THREADS=1 .venv/bin/python examples/reproduce_row.py 2>&1 | grep -v Warning
    echo "exit ${PIPESTATUS[0]}"
  } >"$OUT/$setting-example.txt"
  tail -n 2 "$OUT/$setting-example.txt"
  grep -q "^exit 0" "$OUT/$setting-example.txt" || status=1
  if [ "$suite" = "--suite" ]; then
    {
      echo "# $setting: ${env[*]:-(no limit)}; $(date -u +%Y-%m-%dT%H:%MZ)"
      echo "# command: ${env[*]} OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q -n auto -p no:warnings"
      env "${env[@]}" OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q -n auto -p no:warnings 2>&1 \
        | grep -E "FAILED|ERROR|passed|failed"
      echo "exit ${PIPESTATUS[0]}"
    } >"$OUT/$setting-suite.txt"
    tail -n 2 "$OUT/$setting-suite.txt"
    grep -q "^exit 0" "$OUT/$setting-suite.txt" || status=1
  fi
done
exit $status
