#!/usr/bin/env bash
# Runs every unit test program and integration script and ends with one line
# "N passed, M failed[, K skipped]".  Exit status is non-zero on any failure.
#
#   tests/run.sh [--unit|--integration] [FILTER]
#
# Integration scripts run SHOAL_TEST_JOBS at a time (default: the online
# cores): each has its own temporary directory and ephemeral ports.  A
# script whose figures depend on having the machine to itself (a pinger's
# answer times, say) says so with a line "# test: serial" and runs alone,
# after the others.
# Unit programs are cmocka binaries under $BUILD/tests/unit/; their own
# case counts are added up.  Integration scripts are tests/integration/test_*.sh;
# each counts as one test: exit 0 passes, 77 skips (it says why), else fails.
# A test's output is kept in $BUILD/test-logs/ and shown when it fails.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
export BUILD BIN
export SHOAL_ROOT=$PWD
what=all
[ "${1:-}" = --unit ] && { what=unit; shift; }
[ "${1:-}" = --integration ] && { what=integration; shift; }
filter=${1:-}
logs=$BUILD/test-logs
mkdir -p "$logs"
passed=0 failed=0 skipped=0
failures=()
TIMEOUT=${SHOAL_TEST_TIMEOUT:-600}

show_fail() {
    echo "---- output of $1 (last 40 lines; whole log: $2)"
    tail -n 40 "$2"
    echo "----"
}

run_unit() {
    local t=$1 name=${1#"$BUILD"/tests/} log
    log=$logs/${name//\//_}.log
    timeout "$TIMEOUT" "$t" >"$log" 2>&1
    local rc=$? p f s
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed or timed out
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ "$f" -gt 0 ]; then
        printf 'FAIL  %-44s %d passed, %d failed (exit %d)\n' "$name" "$p" "$f" "$rc"
        failures+=("$name"); show_fail "$name" "$log"
    else
        printf 'ok    %-44s %d passed%s\n' "$name" "$p" "$([ "$s" -gt 0 ] && echo ", $s skipped")"
    fi
}

finish_integration() {   # NAME LOG RC SECS
    local name=$1 log=$2 rc=$3 secs=$4
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1)); printf 'ok    %-44s (%ds)\n' "$name" "$secs"
    elif [ "$rc" -eq 77 ]; then
        skipped=$((skipped + 1)); printf 'skip  %-44s %s\n' "$name" "$(tail -n 1 "$log")"
    else
        failed=$((failed + 1)); failures+=("$name")
        printf 'FAIL  %-44s exit %d (%ds)\n' "$name" "$rc" "$secs"; show_fail "$name" "$log"
    fi
}

# Start script $1 in the background; its exit status and seconds land in
# $logs/NAME.rc when it ends.
start_integration() {
    local t=$1 name=${1#tests/} log
    log=$logs/${name//\//_}.log
    rm -f "$log.rc"
    ( start=$(date +%s); timeout "$TIMEOUT" bash "$t" >"$log" 2>&1; rc=$?
      echo "$rc $(( $(date +%s) - start ))" > "$log.rc.tmp" && mv "$log.rc.tmp" "$log.rc" ) &
    running+=("$name")
}

# Wait until fewer than $1 scripts run, reporting each that ended.
reap_integration() {
    local limit=$1 name log rc secs
    while [ ${#running[@]} -ge "$limit" ] && [ ${#running[@]} -gt 0 ]; do
        local still=()
        for name in "${running[@]}"; do
            log=$logs/${name//\//_}.log
            if [ -f "$log.rc" ]; then
                read -r rc secs < "$log.rc"
                finish_integration "$name" "$log" "$rc" "$secs"
            else
                still+=("$name")
            fi
        done
        running=("${still[@]}")
        [ ${#running[@]} -ge "$limit" ] && sleep 0.2
    done
}

if [ $what != integration ]; then
    for t in $(find "$BUILD/tests/unit" -type f -name 'test_*' -perm -u+x 2>/dev/null | sort); do
        case $t in *.d|*.o) continue ;; esac
        src=tests/${t#"$BUILD"/tests/}.c
        [ -f "$src" ] || continue      # a stale binary whose source is gone
        [ -n "$filter" ] && [[ $t != *$filter* ]] && continue
        run_unit "$t"
    done
fi
if [ $what != unit ]; then
    JOBS=${SHOAL_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
    running=() serial=()
    wait_all() { wait; reap_integration 1; }
    trap 'kill $(jobs -p) 2>/dev/null' EXIT
    for t in tests/integration/test_*.sh; do
        [ -e "$t" ] || continue
        [ -n "$filter" ] && [[ $t != *$filter* ]] && continue
        if grep -q '^# test: serial' "$t"; then serial+=("$t"); continue; fi
        reap_integration "$JOBS"
        start_integration "$t"
    done
    wait_all
    for t in "${serial[@]}"; do
        start_integration "$t"
        wait_all
    done
fi

if [ ${#failures[@]} -gt 0 ]; then
    echo "failed: ${failures[*]}"
fi
if [ $skipped -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ $failed -eq 0 ] && [ $((passed + failed)) -gt 0 ]
