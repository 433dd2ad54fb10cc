#!/usr/bin/env bash
# Runs each tests/test_*.py in a pytest process of its own, JOBS files at a time (default 2), and prints each file's
# output whole when it ends. Two at a time on CI's two cores: while one file compiles (one core), the other runs.
# The files in ALONE then run one at a time: they time processes against limits (a lost peer declared within 20 s,
# signals to a training run, a browser, W&B's service) that a compile beside them could push past.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHON=${PYTHON:-.venv/bin/python}
JOBS=${1:-2}
ALONE=(tests/test_checkpoint.py tests/test_multiprocess.py tests/test_multiprocess_survival.py tests/test_viewer.py
    tests/test_wandb.py)
LOGS=$(mktemp -d)
export LOGS
trap 'rm -rf "$LOGS"' EXIT

run_file() {
    local log
    log="$LOGS/$(basename "$1").log"
    "$PYTHON" -m pytest -q "$1" >"$log" 2>&1 || echo "$1" >>"$LOGS/failed"
    flock "$LOGS/print.lock" bash -c 'echo "== $1"; cat "$2"' _ "$1" "$log"
}
export -f run_file

shared=()
for file in tests/test_*.py; do
    [[ " ${ALONE[*]} " == *" $file "* ]] || shared+=("$file")
done
printf '%s\n' "${shared[@]}" | xargs -P "$JOBS" -I{} bash -c 'run_file "$1"' _ {}
for file in "${ALONE[@]}"; do
    run_file "$file"
done
if [[ -s "$LOGS/failed" ]]; then
    echo "FAILED: $(sort "$LOGS/failed" | paste -sd " ")"
    exit 1
fi
echo "all test files passed"
