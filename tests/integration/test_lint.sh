#!/usr/bin/env bash
# test_lint.sh — `make lint` enforces the rooms (docs/README.md) and the platform
# layer (no Linux-only header, call or /proc path outside common/platform*): it is run
# on a fixture tree holding one deliberate violation of each kind and must
# fail naming each offending file with the rule it breaks; the same tree
# without the violations must pass; and the real tree must be clean.
source "$(dirname "$0")/lib.sh"

LINT=$ROOT/scripts/lint.sh

# put FILE LINE...: write a fixture file (parents created).
put() {
    local f=$1; shift
    mkdir -p "$(dirname "$f")"
    printf '%s\n' "$@" >"$f"
}

# A small tree that follows every rule: each room's own private header,
# the directions the engine allows, a test and a fuzz target that may see
# the private header of what they test.
make_clean() {
    local d=$1
    put "$d/common/err.h" '/* err.h */'
    put "$d/common/client.h" '/* client.h */'
    put "$d/fetcher/fetch_int.h" '/* fetch_int.h */'
    put "$d/fetcher/xfer.c" '#include "fetcher/fetch_int.h"'
    put "$d/daemon/daemon_int.h" '/* daemon_int.h */'
    put "$d/engine/text/text.h" '#include "common/err.h"'
    put "$d/engine/text/text_int.h" '#include "engine/text/text.h"'
    put "$d/engine/text/tokenizer.c" '#include "engine/text/text_int.h"'
    put "$d/engine/kernels/kernels.h" '/* kernels.h */'
    put "$d/engine/kernels/kernels_int.h" '#include "engine/kernels/kernels.h"'
    put "$d/engine/kernels/ref.c" '#include "engine/kernels/kernels_int.h"'
    put "$d/engine/forward/forward.h" '#include "engine/kernels/kernels.h"'
    put "$d/engine/forward/forward_int.h" '#include "engine/forward/forward.h"'
    put "$d/engine/forward/forward.c" '#include "engine/forward/forward_int.h"' '#include "common/err.h"'
    put "$d/engine/source/source.h" '#include "engine/forward/forward.h"'
    put "$d/engine/source/remote.c" '#include "engine/source/source.h"' '#include "common/client.h"'
    put "$d/engine/serve/serve.h" '#include "engine/text/text.h"'
    put "$d/engine/serve/serve_int.h" '#include "engine/serve/serve.h"'
    put "$d/engine/serve/server.c" '#include "engine/serve/serve_int.h"' \
        '#include "engine/source/source.h"' '#include "engine/forward/forward.h"'
    put "$d/engine/cli/cli_int.h" '/* cli_int.h */'
    put "$d/engine/cli/main.c" '#include "engine/cli/cli_int.h"' '#include "engine/serve/serve.h"' \
        '#include "engine/text/text.h"'
    put "$d/tools/foo/foo_int.h" '/* foo_int.h */'
    put "$d/tools/foo/main.c" '#include "tools/foo/foo_int.h"'
    put "$d/tests/unit/fetcher/test_xfer.c" '#include "fetcher/fetch_int.h"'
    put "$d/tests/unit/text/test_tok.c" '#include "engine/text/text_int.h"'
    put "$d/tests/fuzz/proto.c" '/* fuzz-sources: common/ daemon/request.c */' '#include "daemon/daemon_int.h"'
    # the platform layer may call what only Linux has; others may name it
    # in comments and messages, and call a member of that name
    put "$d/common/platform_os.c" '#include <sys/vfs.h>' \
        'int anon(void) { return memfd_create("x", MFD_CLOEXEC); }' \
        'int rd(const char *p) { return open("/proc/self/status", O_RDONLY | O_DIRECT); }'
    put "$d/engine/source/msg.c" '/* read with O_DIRECT (posix_fadvise otherwise) */' \
        'const char *m = "read into memory with O_DIRECT";' \
        'int al(struct io *io) { return io->fallocate(1) + io2.fallocate(2); }'
}

# The clean tree passes (so the failures below come from the violations).
make_clean "$T/clean"
"$LINT" "$T/clean" >"$T/clean.out" 2>&1 || { cat "$T/clean.out"; fail "lint fails a tree that follows every rule"; }
grep -q '^lint: clean' "$T/clean.out" || fail "no 'lint: clean' line for the clean fixture"

# The same tree with one violation of each kind.
bad=$T/bad
make_clean "$bad"
put "$bad/engine/serve/peek.c" '#include "engine/forward/forward_int.h"'       # another room's _int.h
put "$bad/tools/bar/main.c" '#include "tools/foo/foo_int.h"'                   # ... between tools
put "$bad/tests/fuzz/other.c" '/* fuzz-sources: common/ */' '#include "daemon/daemon_int.h"'
put "$bad/engine/text/up.c" '#include "engine/serve/serve.h"'                  # text uses nothing
put "$bad/engine/kernels/up.c" '#include "engine/forward/forward.h"'           # kernels: nothing
put "$bad/engine/forward/client.c" '#include "common/client.h"'                # no daemon client
put "$bad/engine/text/proto.c" '#include "common/proto.h"'
put "$bad/engine/forward/up.c" '#include "engine/source/source.h"'             # forward: kernels only
put "$bad/engine/source/up.c" '#include "engine/serve/serve.h"'                # source: never serve
put "$bad/engine/serve/up.c" '#include "engine/cli/cli_int.h"'                 # serve: never cli
put "$bad/engine/forward/cache.c" '#include "cache/cache.h"'                   # the engine never links cache/
put "$bad/engine/floor.c" '/* on the floor */'                                # outside any room
put "$bad/engine/misc/x.c" '/* a folder the table does not know */'
put "$bad/common/old.c" 'int f(char *b) { return sprintf(b, "x"); }'          # an old rule still holds
# Linux-only calls, headers and paths outside common/platform* (macOS)
put "$bad/daemon/memfd.c" 'int f(void) { return memfd_create("m", 0); }'
put "$bad/engine/source/direct.c" 'int g(int fd) { return posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); }'
put "$bad/tools/foo/vfs.c" '#include <sys/vfs.h>'
put "$bad/cache/proc.c" 'const char *p = "/proc/meminfo";'

"$LINT" "$bad" >"$T/bad.out" 2>&1
rc=$?
cat "$T/bad.out"
[ $rc -eq 1 ] || fail "lint exited $rc on the fixture with violations, not 1"

# expect FILE REGEX: lint named FILE with a message matching REGEX.
expect() {
    grep -E "^$1:[0-9]+: " "$T/bad.out" | grep -qE "$2" || fail "lint did not report $1 (/$2/)"
}
expect engine/serve/peek.c 'private header of engine/forward/'
expect tools/bar/main.c 'private header of tools/foo/'
expect tests/fuzz/other.c 'private header of daemon/'
expect engine/text/up.c 'engine/text/ may not include engine/serve/serve.h'
expect engine/kernels/up.c 'engine/kernels/ may not include engine/forward/forward.h'
expect engine/forward/client.c 'may not include common/client.h'
expect engine/text/proto.c 'may not include common/proto.h'
expect engine/forward/up.c 'engine/forward/ may not include engine/source/source.h'
expect engine/source/up.c 'engine/source/ may not include engine/serve/serve.h'
expect engine/serve/up.c 'private header of engine/cli/'
expect engine/serve/up.c 'engine/serve/ may not include engine/cli/cli_int.h'
expect engine/forward/cache.c 'may not include cache/cache.h'
expect engine/floor.c "on engine/'s floor"
expect engine/misc/x.c 'not a room of the engine'
expect common/old.c 'banned function: sprintf'
expect daemon/memfd.c 'Linux-only memfd_create outside the platform layer'
expect engine/source/direct.c 'Linux-only posix_fadvise outside the platform layer'
expect tools/foo/vfs.c 'Linux-only header <sys/vfs.h>'
expect cache/proc.c 'a /proc or /sys path outside the platform layer'

# Nothing from the clean part of the tree is reported.
n_bad=$(grep -cE '^[^ ]+:[0-9]+: ' "$T/bad.out")
n_files=$(grep -E '^[^ ]+:[0-9]+: ' "$T/bad.out" | cut -d: -f1 | sort -u | wc -l)
[ "$n_files" -eq 18 ] || fail "lint named $n_files files, expected the 18 with violations"
echo "fixture: $n_bad findings in $n_files files"

# The real tree is clean.
"$LINT" >"$T/real.out" 2>&1 || { cat "$T/real.out"; fail "make lint is not clean on the tree"; }
echo "lint rules on rooms and the platform layer OK"
