#!/usr/bin/env bash
# The float64 numpy reference (tests/reference/k3_ref.py): its format, router
# and KDA checks always run; the model checks run on a tiny-k3 written by
# bin/mkmodel into $T.  Skips when /usr/bin/python3 has no numpy.
source "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
[ -x "$PY" ] || skip "no $PY"
"$PY" -c 'import numpy' 2>/dev/null || skip "numpy missing for $PY (apt-get install python3-numpy)"
REF=$ROOT/tests/reference

if [ ! -x "$BIN/mkmodel" ]; then
    "$PY" "$REF/test_reference.py" || fail "reference self-checks"
    skip "no $BIN/mkmodel: model checks not run (self-checks passed)"
fi

"$BIN/mkmodel" --preset tiny --seed 3 --out "$T/tiny" >"$T/mkmodel.log" 2>&1 \
    || { cat "$T/mkmodel.log"; fail "mkmodel --preset tiny"; }
"$PY" "$REF/test_reference.py" --model "$T/tiny" || fail "reference checks on tiny-k3"

# the command line as a C engine's comparison will use it: 20-token prompt,
# 16 greedy tokens, both dumps, in a few seconds
start=$(date +%s)
"$PY" "$REF/k3_ref.py" "$T/tiny" --tokens "$(seq -s, 100 119)" --max-tokens 16 \
    --dump-logits "$T/logits.f32" --dump-hidden "$T/hidden.npy" --json >"$T/ref.out" \
    || fail "k3_ref.py run"
secs=$(( $(date +%s) - start ))
echo "k3_ref.py: 20 + 16 tokens in ${secs}s: $(tail -n 1 "$T/ref.out")"
[ "$(tail -n 1 "$T/ref.out" | wc -w)" -eq 16 ] || fail "expected 16 generated ids"
[ "$(stat -c %s "$T/logits.f32")" -eq $((16 * 1024 * 4)) ] || fail "logits dump size"
"$PY" -c 'import numpy,sys; a=numpy.load(sys.argv[1]); assert a.shape==(35,8,256), a.shape' \
    "$T/hidden.npy" || fail "hidden dump shape"
[ "$secs" -le 30 ] || fail "k3_ref.py took ${secs}s for tiny"
exit 0
