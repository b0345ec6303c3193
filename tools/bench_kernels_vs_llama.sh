#!/usr/bin/env bash
# One-token products kernel against kernel: edged's tools/bench_kernels.py and llama.cpp's
# test-backend-ops (perf mode, MUL_MAT) on the same shape (m rows x k, n = 1), type by type,
# edged then llama.cpp, ROUNDS rounds interleaved (this machine's speed drifts). Prints
# "round type edged_us llama_us load" lines; take each program's best per type.
#
#   tools/bench_kernels_vs_llama.sh LLAMA_BUILD/bin/test-backend-ops [ROUNDS] [TYPES...]
#
# test-backend-ops runs max(1, cores / 2) threads: on a 2-core machine one, as -t 1 here.
# EDGED_KERNELS is passed through (e.g. avx2-vnni for edged's plain-AVX2 table).
set -euo pipefail
cd "$(dirname "$0")/.."
TBO=${1:?usage: $0 TEST_BACKEND_OPS [ROUNDS] [TYPES...]}
ROUNDS=${2:-3}
shift $(( $# < 2 ? $# : 2 ))
TYPES=${*:-Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 MXFP4 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS}
M=4096 K=14336
PY=${PYTHON:-.venv/bin/python}
for r in $(seq "$ROUNDS"); do
    for t in $TYPES; do
        lt=$(echo "$t" | tr 'A-Z' 'a-z' | sed 's/_k$/_K/')
        e=$("$PY" tools/bench_kernels.py -t 1 --rows $M -k $K -r 7 --tokens 4 --types "$t" | awk -F'|' '/^\| [A-Z]/ {gsub(/ /, "", $13); print $13}')
        l=$("$TBO" perf -o MUL_MAT -b CPU -p "type_a=$lt,type_b=f32,m=$M,n=1,k=$K,bs=\\[1,1\\]" 2>&1 \
            | sed 's/\x1b\[[0-9;]*m//g' | awk '/MUL_MAT\(/ {for (i = 1; i <= NF; i++) if ($i == "us/run") print $(i - 1)}')
        echo "$r $t ${e:-?} ${l:-?} $(cut -d' ' -f1 /proc/loadavg)"
    done
done
