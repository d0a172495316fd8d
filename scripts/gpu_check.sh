#!/usr/bin/env bash
# The checks that need a GPU, in one run (by hand, on a machine with CUDA; CI has none).
#
#   bash scripts/gpu_check.sh [OUT_DIR]
#
# Runs from the source tree with whatever python3, torch and pytest the machine has (no
# install): the CUDA tests of tests/integration/test_device.py, the leak and doc tests (the
# Python there may not be CI's 3.11), scripts/pinned_copy_race.py, then benchmarks/bench_device.py.
# Logs and the device results go to OUT_DIR (default $OUT, else ./gpu-check). Each step has
# its own time limit; the script exits non-zero if any step failed, after running them all.
set -u
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-check}}"
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0
touch "$out/summary.txt.start"
step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "== $name" | tee -a "$out/summary.txt"
    if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then
        tail -n 1 "$out/$name.log" | tee -a "$out/summary.txt"
    else
        echo "FAILED (exit $?): see $name.log" | tee -a "$out/summary.txt"
        tail -n 30 "$out/$name.log"
        status=1
    fi
}
{ nvidia-smi -L 2>&1; python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())"; } \
    | tee "$out/summary.txt"
step device_tests 240 python3 -m pytest tests/integration/test_device.py -q -rs -p no:cacheprovider
step leaks_docs 240 python3 -m pytest tests/integration/test_leaks.py tests/integration/test_docs.py -q -p no:cacheprovider
step pinned_copy_race 120 python3 scripts/pinned_copy_race.py
step bench_device 300 python3 benchmarks/bench_device.py
# the device results this run wrote (without CUDA the benchmark skips and writes none)
find benchmarks/results -maxdepth 1 -name 'device.*' -newer "$out/summary.txt.start" -exec cp {} "$out/" \;
rm -f "$out/summary.txt.start"
exit $status
