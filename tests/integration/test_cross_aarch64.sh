#!/usr/bin/env bash
# test_cross_aarch64.sh — the whole project cross-builds for arm64 Linux
# (`make CROSS=aarch64-linux-gnu tests-build`: every binary, library and
# unit test, against the Debian multiarch arm64 -dev packages that
# scripts/deps.sh --cross installs), every binary is an AArch64 ELF, and a
# few run under qemu-aarch64: shoald and shoal-engine --version (the engine
# picks its NEON kernels), the platform layer's unit tests, mkmodel making a
# tiny model and shoal-engine inspecting it.
# The build goes to build-aarch64/ beside the normal one, so a second run
# is incremental.  Skips when the cross tools cannot be had (no root to
# install them, or not an x86_64 machine).
source "$(dirname "$0")/lib.sh"

TRIPLET=${SHOAL_CROSS:-aarch64-linux-gnu}
QEMU=${QEMU_AARCH64:-qemu-aarch64}
XB=$ROOT/build-aarch64
[ -z "${SHOAL_PORTABLE:-}" ] || skip "the cross build is tested by the normal run (make test), not again under PORTABLE=1"
[ "$(uname -m)" = x86_64 ] || skip "the cross test runs on x86_64 machines (this is $(uname -m))"
if ! "$ROOT/scripts/deps.sh" --check --cross "$TRIPLET" >/dev/null 2>&1; then
    "$ROOT/scripts/deps.sh" --if-missing --cross "$TRIPLET" >"$T/deps.log" 2>&1 \
        || { cat "$T/deps.log"; skip "cannot install the $TRIPLET packages (scripts/deps.sh --cross $TRIPLET)"; }
fi
command -v "$QEMU" >/dev/null || skip "no $QEMU (apt-get install qemu-user)"

# ---- build everything --------------------------------------------------------------
env -u BUILD -u BIN make -C "$ROOT" --no-print-directory -j"${JOBS:-2}" CROSS="$TRIPLET" tests-build >"$T/build.log" 2>&1 \
    || { tail -n 40 "$T/build.log"; fail "make CROSS=$TRIPLET tests-build failed"; }
echo "ok   make CROSS=$TRIPLET tests-build"

# e_machine of an ELF file (bytes 18-19, little-endian): 183 is AArch64
machine() { od -An -t u2 -j 18 -N 2 "$1" | tr -d ' '; }
n=0
for b in "$XB"/bin/* $(find "$XB/tests/unit" -type f -name 'test_*' ! -name '*.d' ! -name '*.o'); do
    [ "$(head -c 4 "$b" | od -An -c | tr -d ' ')" = '177ELF' ] || fail "$b is not an ELF file"
    [ "$(machine "$b")" = 183 ] || fail "$b is for machine $(machine "$b"), not AArch64 (183)"
    n=$((n + 1))
done
for want in shoald shoal shoal-engine shoal-fetch hubmock mkmodel hubget stinfo shoalc; do
    [ -x "$XB/bin/$want" ] || fail "the cross build has no bin/$want"
done
[ "$n" -ge 30 ] || fail "only $n AArch64 binaries (binaries and unit tests) were built"
echo "ok   $n binaries and unit tests, all AArch64 ELF"

# ---- run some under qemu -----------------------------------------------------------
# The arm64 loader, libc and libraries are where multiarch put them
# (/lib/ld-linux-aarch64.so.1, /usr/lib/aarch64-linux-gnu: libc6:arm64
# comes with the -dev packages).  Not QEMU_LD_PREFIX=/usr/$TRIPLET: the
# cross toolchain's libc beside multiarch's libraries made shoal-engine
# run spin for ever under qemu here, where multiarch's alone never did.
[ -e /lib/ld-linux-aarch64.so.1 ] || skip "no /lib/ld-linux-aarch64.so.1 (apt-get install libc6:arm64)"
run() { timeout 300 "$QEMU" "$@"; }   # a hang fails here, not at run.sh's limit
for b in shoald shoal-engine; do
    run "$XB/bin/$b" --version >"$T/$b.version" 2>&1 || { cat "$T/$b.version"; fail "$b --version under qemu"; }
    grep -qi "$b" "$T/$b.version" || { cat "$T/$b.version"; fail "$b --version does not name itself"; }
done
echo "ok   shoald and shoal-engine --version under qemu: $(head -n 1 "$T/shoald.version")"
for u in common/test_platform common/test_platform_os common/test_proto; do
    run "$XB/tests/unit/$u" >"$T/unit.log" 2>&1 || { tail -n 30 "$T/unit.log"; fail "$u under qemu"; }
    grep -q '^\[  PASSED  \]' "$T/unit.log" || { cat "$T/unit.log"; fail "$u: no PASSED line"; }
done
echo "ok   unit tests of the platform layer and the protocol pass under qemu"

run "$XB/bin/mkmodel" --preset tiny --out "$T/tiny" >"$T/mkmodel.log" 2>&1 \
    || { tail -n 20 "$T/mkmodel.log"; fail "mkmodel --preset tiny under qemu"; }
[ -f "$T/tiny/config.json" ] || fail "mkmodel made no config.json"
shard=$(ls "$T/tiny"/model-*.safetensors | head -n 1)
run "$XB/bin/stinfo" "$shard" >"$T/stinfo.log" 2>&1 || { tail -n 20 "$T/stinfo.log"; fail "stinfo under qemu"; }
"$BIN/stinfo" "$shard" >"$T/stinfo_host.log" 2>&1
diff "$T/stinfo_host.log" "$T/stinfo.log" >&2 || fail "stinfo on AArch64 lists the shard differently from here"
echo "ok   mkmodel and stinfo under qemu: a tiny model, $(ls "$T/tiny" | wc -l) files, listed as here"
# the engine: it picks NEON, and generates on the model
run "$XB/bin/shoal-engine" info >"$T/info.txt" 2>&1 || { cat "$T/info.txt"; fail "shoal-engine info under qemu"; }
grep -q '^isa: neon' "$T/info.txt" || { cat "$T/info.txt"; fail "the AArch64 engine did not pick its NEON kernels"; }
run "$XB/bin/shoal-engine" run "$T/tiny" --tokens 7,100,300 --max-tokens 3 --json >"$T/run.json" 2>"$T/run.err" \
    || { tail -n 20 "$T/run.err"; fail "shoal-engine run under qemu"; }
grep -qE '"tokens":\[[0-9]+,[0-9]+,[0-9]+\]' "$T/run.json" || { cat "$T/run.json"; fail "no three generated tokens"; }
# the same greedy tokens as this machine's build (its AVX2/AVX-512 or scalar
# kernels): the quantized products are bit-identical across ISAs
"$BIN/shoal-engine" run "$T/tiny" --tokens 7,100,300 --max-tokens 3 --json >"$T/run_host.json" 2>/dev/null \
    || fail "shoal-engine run on this machine"
a=$(grep -oE '"tokens":\[[0-9,]*\]' "$T/run.json"); h=$(grep -oE '"tokens":\[[0-9,]*\]' "$T/run_host.json")
[ "$a" = "$h" ] || fail "AArch64 generated $a, this machine $h"
echo "ok   shoal-engine under qemu: isa neon, the same 3 tokens as here ($a)"
echo "cross build for $TRIPLET OK"
