#!/usr/bin/env bash
# One device run: the kernel tests compiled on the GPU, then benches/gpu_kernels.py.
#
# Usage, from the repository root of a CUDA machine (torch + triton installed, kvindex's
# native module importable: an installed wheel, or python/kvindex/_core.abi3.so beside
# the sources):   OUT=/some/dir benches/gpu_run.sh
# Writes under $OUT: nvidia_smi.csv, tests.log, bench.log, gpu_kernels.json. The tests and
# the timed benchmark run one after the other with their own time limits, so a slow test
# cannot cost the measurements. Exit status: the benchmark's, or 3 when the tests failed.
# DRY=1 checks the script itself on a CPU: interpreter, one test file, benchmark --dry-run.
set -u
DRY=${DRY:-0}
OUT=${OUT:-$PWD/gpu-run}
PY=${PYTHON:-python3}
TEST_LIMIT=${TEST_LIMIT:-150}
BENCH_LIMIT=${BENCH_LIMIT:-240}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRITON_INTERPRET=$DRY
tests=(tests/kernels -n 8)  # pytest-xdist: the compiles run in parallel
bench_args=()
if [ "$DRY" = 1 ]; then
    tests=(tests/kernels/test_kernel_args.py)
    bench_args=(--dry-run)
fi

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version,memory.used,temperature.gpu \
    --format=csv >"$OUT/nvidia_smi.csv" 2>&1
cat "$OUT/nvidia_smi.csv"
"$PY" -c 'import kvindex.kernels as k, torch, triton; print(k.__file__, torch.__version__, triton.__version__)'

# The CPU-only tests stay on the CPU: the sm_90 compile check (the GPU compiles for real
# here), the interpreter dry run of the benchmark, and the installed-wheel check.
start=$SECONDS
# In a session of its own, so that the time limit ends pytest-xdist's workers too.
setsid "$PY" -m pytest "${tests[@]}" -q -p no:cacheprovider \
    --ignore=tests/kernels/test_sm90_compile.py \
    --ignore=tests/kernels/test_gpu_bench_dry_run.py \
    --ignore=tests/kernels/test_kernels_installed.py >"$OUT/tests.log" 2>&1 &
tests_pid=$!
(sleep "$TEST_LIMIT" && kill -TERM -- "-$tests_pid" && sleep 5 && kill -KILL -- "-$tests_pid") \
    >/dev/null 2>&1 &
watchdog=$!
wait "$tests_pid"
tests_rc=$?
kill "$watchdog" 2>/dev/null
echo "tests: rc=$tests_rc in $((SECONDS - start)) s: $(tail -1 "$OUT/tests.log")"

start=$SECONDS
timeout "$BENCH_LIMIT" "$PY" benches/gpu_kernels.py "${bench_args[@]}" --out "$OUT/gpu_kernels.json" 2>&1 \
    | tee "$OUT/bench.log"
bench_rc=${PIPESTATUS[0]}
echo "bench: rc=$bench_rc in $((SECONDS - start)) s"
if [ "$tests_rc" -ne 0 ]; then
    grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
    [ "$bench_rc" -eq 0 ] && exit 3
fi
exit "$bench_rc"
