#!/usr/bin/env bash
# test_mpi.sh — expert parallelism over MPI (docs/mpi.md, issue 19):
#   - builds `make MPI=1` into its own build directory ($BUILD-mpi);
#   - `mpirun -np 3 shoal-engine run hf://... --experts-over-ranks` with
#     three shoald homes (--home DIR/h%r) and one hubmock gives the greedy
#     ids and the logits of a single process, bit for bit, on tiny-k3
#     (cold: every expert from the network, then warm) and on the slice;
#     rank 0's shoald holds no expert, the owners' shoalds each theirs;
#   - an owner whose shoald is not running: rank 0 says so;
#   - an owner killed mid-run (SIGKILL): rank 0 prints a clear error and
#     the run ends within its timeout; an owner that hangs (SIGSTOP): rank
#     0's deadline (--timeout) names it and ends the run.
# Skips (77) only when no MPI implementation can be built against.
source "$(dirname "$0")/lib.sh"
command -v mpicc >/dev/null && command -v mpirun >/dev/null \
    || skip "no mpicc/mpirun (scripts/deps.sh installs Debian's libopenmpi-dev and openmpi-bin)"
for b in shoal-engine shoald hubmock mkmodel shoal; do
    [ -x "$BIN/$b" ] || fail "$BIN/$b is not built (make)"
done
MB=${BUILD:-build}-mpi
( cd "$ROOT" && make --no-print-directory -j2 MPI=1 BUILD="$MB" BIN="$MB/bin" "$MB/bin/shoal-engine" ) \
    > "$T/make.log" 2>&1 || { tail -n 30 "$T/make.log"; fail "make MPI=1 failed"; }
EM=$ROOT/$MB/bin/shoal-engine
E1=$BIN/shoal-engine
MPIRUN=(mpirun --oversubscribe -np 3)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
echo "ok   make MPI=1 built $EM ($(mpirun --version | head -n 1))"

# the build without MPI=1 refuses the option, saying how to get it
"$E1" run "$T/none" --tokens 1 --experts-over-ranks > /dev/null 2> "$T/nompi.err" \
    && fail "the build without MPI=1 took --experts-over-ranks"
grep -q 'make MPI=1' "$T/nompi.err" || { cat "$T/nompi.err"; fail "no hint at make MPI=1"; }

"$BIN/mkmodel" --preset tiny --seed 3 --out "$T/tiny" --quiet || fail "mkmodel tiny"
"$BIN/mkmodel" --preset slice --experts 4 --out "$T/slice" --quiet || fail "mkmodel slice"
start_hubmock --repo t/tiny="$T/tiny" --repo t/slice="$T/slice" --log "$T/hub.jsonl"
export HF_ENDPOINT=$HUB
for r in 0 1 2; do
    mkdir -p "$T/h$r"
    bg "shoald$r" "$BIN/shoald" --home "$T/h$r" --no-fsync --log "$T/shoald$r.log"
done
for r in 0 1 2; do wait_line "$T/shoald$r.log" 'ready on' 20 || fail "shoald $r did not start"; done

P=7,100,300,5,9,42,11,12,13,700,1
single() {   # NAME MODEL N ARGS...: one process through shoald 0
    local name=$1 model=$2 n=$3; shift 3
    timeout 300 "$E1" run "$model" --home "$T/h0" --tokens $P --max-tokens "$n" \
        --dump-logits "$T/l_$name" "$@" > "$T/o_$name" 2> "$T/e_$name" \
        || { cat "$T/e_$name"; fail "$name: single-process run"; }
}
ranks() {    # NAME MODEL N ARGS...: three ranks, shoald r for rank r
    local name=$1 model=$2 n=$3; shift 3
    timeout 300 "${MPIRUN[@]}" "$EM" run "$model" --home "$T/h%r" --experts-over-ranks \
        --tokens $P --max-tokens "$n" --dump-logits "$T/l_$name" --stats "$@" \
        > "$T/o_$name" 2> "$T/e_$name" || { cat "$T/e_$name"; fail "$name: mpirun -np 3"; }
}
same() {     # A B: ids and logits bit for bit
    cmp -s "$T/o_$1" "$T/o_$2" || fail "$2: ids '$(cat "$T/o_$2")' differ from $1's '$(cat "$T/o_$1")'"
    cmp -s "$T/l_$1" "$T/l_$2" || fail "$2: logits differ from $1's"
    [ -s "$T/l_$2" ] || fail "$2: no logits dumped"
}
rank_tier() { sed -n "s/.*stats: rank $2: .* $3 \([0-9]*\).*/\1/p" "$T/e_$1" | head -n 1; }

# ---- tiny-k3: cold (the owners fetch from the network), then warm -------------
single tiny hf://t/tiny 6 --threads 2
"$E1" run "$T/tiny" --tokens $P --max-tokens 6 --dump-logits "$T/l_tinydir" > "$T/o_tinydir" 2>/dev/null \
    || fail "tiny: local directory run"
same tiny tinydir
ranks tiny_cold hf://t/tiny 6 --threads 1
same tiny tiny_cold
for r in 1 2; do
    [ "$(rank_tier tiny_cold $r network)" -gt 0 ] || { cat "$T/e_tiny_cold"; fail "rank $r fetched no expert upstream"; }
done
ranks tiny_warm hf://t/tiny 6 --threads 1 --expert-ram 1M
same tiny tiny_warm
for r in 1 2; do
    [ "$(rank_tier tiny_warm $r network)" = 0 ] && [ "$(rank_tier tiny_warm $r disk)" -gt 0 ] \
        || { cat "$T/e_tiny_warm"; fail "rank $r: the warm run did not read its experts from its disk"; }
done
grep -q '^stats: ranks: .* bytes out' "$T/e_tiny_warm" || { cat "$T/e_tiny_warm"; fail "no ranks figures"; }
# rank 0 asked its own shoald for no expert; owners' caches hold theirs
grep -q 'experts [0-9]* loads .* 0.0 MiB read' "$T/e_tiny_cold" || { cat "$T/e_tiny_cold"; fail "rank 0 read experts itself"; }
# a directory model on every rank works the same
ranks tiny_dir "$T/tiny" 6 --threads 1
same tiny tiny_dir
echo "ok   tiny-k3: mpirun -np 3 == one process, ids $(cat "$T/o_tiny") and logits bit for bit (cold, warm, directory); $(grep '^stats: ranks: .*per token' "$T/e_tiny_warm" | sed 's/^stats: ranks: //')"

# ---- serve: the same completion from mpirun -np 3 as from one process ----------
complete() {   # LOGNAME: a greedy completion from the server that logged "listening on"
    local url
    wait_line "$T/$1.log" '^listening on http' 120 || fail "$1 did not start"
    url=$(sed -n 's/^listening on \(http:.*\)$/\1/p' "$T/$1.log" | head -n 1)
    curl -sf "$url/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"hello there","max_tokens":8,"temperature":0}' \
        | sed 's/.*"text":"\([^"]*\)".*/\1/' > "$T/$1.text" || fail "$1: no completion"
}
bg serve1 "$E1" serve hf://t/tiny --home "$T/h0" --port 0 --threads 1
complete serve1
kill -TERM "$PID_serve1"; wait "$PID_serve1" 2>/dev/null
bg serve3 "${MPIRUN[@]}" "$EM" serve hf://t/tiny --home "$T/h%r" --port 0 --threads 1 --experts-over-ranks
complete serve3
cmp -s "$T/serve1.text" "$T/serve3.text" \
    || fail "serve over ranks: '$(cat "$T/serve3.text")' differs from one process's '$(cat "$T/serve1.text")'"
kill -TERM "$PID_serve3"; wait "$PID_serve3" 2>/dev/null
for _ in $(seq 100); do pgrep -f "$EM serve" > /dev/null || break; sleep 0.1; done
pgrep -f "$EM serve" > /dev/null && fail "serve's ranks outlived mpirun's SIGTERM"
echo "ok   serve --experts-over-ranks: the same greedy completion as one process: '$(cat "$T/serve3.text")'"

# ---- the slice: K3's expert size, prefill in chunks --------------------------
single slice hf://t/slice 3 --threads 2 --chunk 4
ranks slice hf://t/slice 3 --threads 1 --chunk 4
same slice slice
echo "ok   slice: mpirun -np 3 == one process, ids $(cat "$T/o_slice") and logits bit for bit; $(grep '^stats: ranks: .*span' "$T/e_slice" | sed 's/^stats: ranks: //')"

# ---- an owner without its shoald: rank 0 says which and why --------------------
kill -TERM "$PID_shoald2"; wait "$PID_shoald2" 2>/dev/null
timeout 120 "${MPIRUN[@]}" "$EM" run hf://t/tiny --home "$T/h%r" --experts-over-ranks \
    --tokens $P --max-tokens 2 > "$T/o_nod" 2> "$T/e_nod" && fail "ran without rank 2's shoald"
grep -q '^run: rank 2: .*shoald' "$T/e_nod" || { cat "$T/e_nod"; fail "rank 0 did not name rank 2's missing shoald"; }
echo "ok   an owner without shoald: $(grep -m1 '^run: rank 2' "$T/e_nod" | head -c 160)"
bg shoald2 "$BIN/shoald" --home "$T/h2" --no-fsync --log "$T/shoald2b.log"
wait_line "$T/shoald2b.log" 'ready on' 20 || fail "shoald 2 did not restart"

# ---- a killed owner, a hung owner: an error on rank 0, no hang ----------------
rank_pid() {   # RANK: the pid of that rank's shoal-engine (Open MPI's environment)
    local p
    for p in $(pgrep -f "$EM run"); do
        tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
    done
}
long_run() {   # NAME TIMEOUT_MS: a long run on the warm caches (~10 s of tokens)
    timeout 120 "${MPIRUN[@]}" "$EM" run hf://t/tiny --home "$T/h%r" --experts-over-ranks \
        --tokens $P --max-tokens 3000 --threads 1 --timeout "$2" > "$T/o_$1" 2> "$T/e_$1" &
    RUNPID=$!
}
for how in KILL STOP; do
    to=60000; [ $how = STOP ] && to=3000
    long_run "$how" $to
    start=$(date +%s)
    pid=
    for _ in $(seq 300); do
        grep -q '^plan: ' "$T/e_$how" 2>/dev/null && pid=$(rank_pid 1)
        [ -n "$pid" ] && break
        sleep 0.1
    done
    [ -n "$pid" ] || { cat "$T/e_$how"; fail "$how: no rank 1 process found"; }
    sleep 1
    kill -0 $RUNPID 2>/dev/null || { cat "$T/e_$how"; fail "$how: the run ended before rank 1 was stopped"; }
    kill -$how "$pid"
    rc=0; wait $RUNPID || rc=$?
    took=$(( $(date +%s) - start ))
    [ $how = STOP ] && kill -KILL "$pid" 2>/dev/null
    [ $rc != 0 ] || { cat "$T/e_$how"; fail "$how: the run succeeded with rank 1 gone"; }
    [ $rc != 124 ] || { cat "$T/e_$how"; fail "$how: the run hung until timeout(1) ended it"; }
    if [ $how = KILL ]; then
        grep -q '^run: rank 0: .*an owner rank died' "$T/e_$how" \
            || { cat "$T/e_$how"; fail "SIGKILL: rank 0 printed no clear error"; }
    else
        grep -q '^run: .*rank 1 has not answered layer [0-9]*.s experts in 3000 ms' "$T/e_$how" \
            || { cat "$T/e_$how"; fail "SIGSTOP: rank 0's deadline did not name rank 1"; }
    fi
    echo "ok   SIGKILL/SIGSTOP of rank 1 ($how): exit $rc after ${took}s: $(grep -m1 '^run: ' "$T/e_$how" | head -c 200)"
done
echo "all MPI checks passed"
