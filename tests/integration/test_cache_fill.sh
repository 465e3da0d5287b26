#!/usr/bin/env bash
# A real full filesystem under the cache: mount an 8 MiB tmpfs (needs root
# and permission to mount; skipped otherwise) and let
# `test_cache_fill --fill DIR` fill it (tests/unit/cache/test_cache_fill.c
# says what it checks: ENOSPC reported, no tmp file or row left behind,
# earlier objects intact, writes work again after removals, clean reopen).
source "$(dirname "$0")/lib.sh"

helper=$ROOT/${BUILD:-build}/tests/unit/cache/test_cache_fill
[ -x "$helper" ] || fail "missing $helper (run make tests-build)"
[ "$(id -u)" -eq 0 ] || skip "needs root to mount a small tmpfs"
mnt=$T/mnt
mkdir -p "$mnt"
mount -t tmpfs -o size=8m shoal-test "$mnt" 2>"$T/mount.err" \
    || skip "mount not permitted here: $(cat "$T/mount.err")"
trap 'umount "$mnt" 2>/dev/null; _cleanup' EXIT

"$helper" --fill "$mnt/cache"
rc=$?
df -k "$mnt" | tail -n 1
[ $rc -eq 0 ] || fail "full filesystem test failed"
echo "ok"
