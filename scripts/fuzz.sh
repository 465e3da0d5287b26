#!/usr/bin/env bash
# make fuzz: builds each libFuzzer target tests/fuzz/NAME.c with clang
# (-fsanitize=fuzzer,address,undefined) against the project's sources and runs
# it for a bounded time on its seed corpus tests/fuzz/corpus/NAME/.
#   FUZZ_SECONDS (default 60 per target)
set -eu
cd "$(dirname "$0")/.."
command -v clang >/dev/null || { echo "fuzz: clang is needed (apt-get install clang)"; exit 1; }
secs=${FUZZ_SECONDS:-60}
out=build-fuzz
mkdir -p "$out"
# A target names the sources it needs in a line "fuzz-sources: ITEM..."
# where an item is a .c file or a folder (all its .c files), e.g.
# "fuzz-sources: common/ fetcher/safetensors.c"; default common/.
cflags="-std=c11 -g -O1 -D_GNU_SOURCE -pthread -I. $(pkg-config --cflags libcurl sqlite3 libevent jansson libpcre2-8 libxxhash libcrypto)"
libs="$(pkg-config --libs libcurl sqlite3 libevent libevent_pthreads jansson libpcre2-8 libxxhash libcrypto) -lm"
n=0
for t in tests/fuzz/*.c; do
    [ -e "$t" ] || continue
    name=$(basename "$t" .c)
    items=$(grep -o 'fuzz-sources:.*' "$t" | head -n 1 | sed 's/fuzz-sources://; s/\*\/.*//')
    srcs=
    for it in ${items:-common/}; do
        case $it in */) srcs="$srcs $(ls "$it"*.c | grep -v '/main\.c$' | tr '\n' ' ')" ;; *) srcs="$srcs $it" ;; esac
    done
    echo "fuzz: building $name"
    # shellcheck disable=SC2086
    clang $cflags -fsanitize=fuzzer,address,undefined -o "$out/$name" "$t" $srcs $libs
    corpus=tests/fuzz/corpus/$name
    work=$out/corpus-$name
    mkdir -p "$work"
    echo "fuzz: running $name for ${secs}s"
    "$out/$name" -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$out/" "$work" ${corpus:+$( [ -d "$corpus" ] && echo "$corpus")} \
        >"$out/$name.log" 2>&1 || { tail -n 30 "$out/$name.log"; echo "fuzz: $name found a crash (see $out/$name.log)"; exit 1; }
    grep -E '^stat::number_of_executed_units' "$out/$name.log" || true
    n=$((n + 1))
done
echo "fuzz: $n targets ran without a crash"
