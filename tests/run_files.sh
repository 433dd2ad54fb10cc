#!/usr/bin/env bash
# Runs each tests/test_*.py in a pytest process of its own, JOBS files at a time (default 2), and prints each file's
# output whole when it ends. Two at a time on CI's two cores: while one file compiles (one core), the other runs.
# The files start longest first, by the seconds tests/durations.txt holds (a file not in it starts first), so the
# lanes end together. The files in ALONE then run one at a time: they time processes against limits (a lost peer
# declared within 20 s, signals to a training run, a browser, W&B's service) that a compile beside them could push
# past. RECORD_DURATIONS=1 rewrites tests/durations.txt from this run.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHON=${PYTHON:-.venv/bin/python}
JOBS=${1:-2}
DURATIONS=tests/durations.txt
ALONE=(tests/test_checkpoint.py tests/test_multiprocess.py tests/test_multiprocess_survival.py tests/test_viewer.py
    tests/test_wandb.py)
LOGS=$(mktemp -d)
export LOGS
trap 'rm -rf "$LOGS"' EXIT

run_file() {
    local log start seconds
    log="$LOGS/$(basename "$1").log"
    start=$(date +%s)
    "$PYTHON" -m pytest -q "$1" >"$log" 2>&1 || echo "$1" >>"$LOGS/failed"
    seconds=$(($(date +%s) - start))
    flock "$LOGS/print.lock" bash -c 'echo "$2 $1" >>"$LOGS/durations"; echo "== $1 ($2 s)"; cat "$3"' _ "$1" "$seconds" "$log"
}
export -f run_file

recorded_seconds() {
    [[ -f "$DURATIONS" ]] && awk -v file="$1" '$2 == file { print $1; exit }' "$DURATIONS"
}

shared=()
for file in tests/test_*.py; do
    [[ " ${ALONE[*]} " == *" $file "* ]] || shared+=("$file")
done
for file in "${shared[@]}"; do
    seconds=$(recorded_seconds "$file")
    echo "${seconds:-999999} $file"
done | sort -k1,1nr -k2 | cut -d' ' -f2 | xargs -P "$JOBS" -I{} bash -c 'run_file "$1"' _ {}
for file in "${ALONE[@]}"; do
    run_file "$file"
done
if [[ "${RECORD_DURATIONS:-0}" == 1 ]]; then
    sort -k1,1nr -k2 "$LOGS/durations" >"$DURATIONS"
fi
if [[ -s "$LOGS/failed" ]]; then
    echo "FAILED: $(sort "$LOGS/failed" | paste -sd " ")"
    exit 1
fi
echo "all test files passed"
