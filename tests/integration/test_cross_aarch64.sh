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
[ "$(uname -m)" = x86_64 ] || skip "the cross test runs on x86_64 machines (this is $(uname -m))"
if ! "$ROOT/scripts/deps.sh" --check --cross "$TRIPLET" >/dev/null 2>&1; then
    "$ROOT/scripts/deps.sh" --if-missing --cross "$TRIPLET" >"$T/deps.log" 2>&1 \
        || { cat "$T/deps.log"; skip "cannot install the $TRIPLET packages (scripts/deps.sh --cross $TRIPLET)"; }
fi
command -v "$QEMU" >/dev/null || skip "no $QEMU (apt-get install qemu-user)"

# ---- build everything --------------------------------------------------------------
make -C "$ROOT" --no-print-directory -j"${JOBS:-2}" CROSS="$TRIPLET" tests-build >"$T/build.log" 2>&1 \
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
# The arm64 loader and libraries are where multiarch put them
# (/lib/ld-linux-aarch64.so.1, /usr/lib/aarch64-linux-gnu); the cross
# toolchain's libc is the fallback.
export QEMU_LD_PREFIX=${QEMU_LD_PREFIX:-/usr/$TRIPLET}
run() { "$QEMU" "$@"; }
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
cmp -s <("$BIN/stinfo" "$shard") "$T/stinfo.log" || fail "stinfo on AArch64 lists the shard differently from here"
echo "ok   mkmodel and stinfo under qemu: a tiny model, $(ls "$T/tiny" | wc -l) files, listed as here"
# the engine: it picks NEON, and generates on the model
run "$XB/bin/shoal-engine" info >"$T/info.txt" 2>&1 || { cat "$T/info.txt"; fail "shoal-engine info under qemu"; }
grep -q '^isa: neon' "$T/info.txt" || { cat "$T/info.txt"; fail "the AArch64 engine did not pick its NEON kernels"; }
run "$XB/bin/shoal-engine" run "$T/tiny" --tokens 7,100,300 --max-tokens 3 --json >"$T/run.json" 2>"$T/run.err" \
    || { tail -n 20 "$T/run.err"; fail "shoal-engine run under qemu"; }
grep -qE '"tokens":\[[0-9]+,[0-9]+,[0-9]+\]' "$T/run.json" || { cat "$T/run.json"; fail "no three generated tokens"; }
echo "ok   shoal-engine under qemu: isa neon, 3 tokens generated"
echo "cross build for $TRIPLET OK"
