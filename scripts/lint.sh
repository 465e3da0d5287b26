#!/usr/bin/env bash
# make lint: the house rules a compiler does not check.
#   - banned functions: sprintf strcpy strcat strtok atoi gets (use snprintf,
#     memcpy with a length, shoal_buf, strtol/strtoull)
#   - files past 1,500 lines, functions past 120 lines
#   - getenv() and exit() outside a program's main file (library code takes
#     its configuration as arguments and returns errors)
#   - rooms (docs/README.md): no file includes another room's private
#     *_int.h, and each room of engine/ includes only the rooms it may use
# Prints each finding as FILE:LINE: message and exits 1 if there is any.
#
#   scripts/lint.sh [ROOT]    ROOT: the tree to check (default: this one);
#                             tests/integration/test_lint.sh checks fixtures
set -u
if [ $# -gt 0 ]; then
    cd "$1" || { echo "lint: no directory $1" >&2; exit 2; }
else
    cd "$(dirname "$0")/.."
fi
if [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$(pwd -P)" ]; then
    srcs=$(git ls-files -co --exclude-standard -- '*.c' '*.h' | grep -v '^tests/node/' | sort)
else   # a tree outside git (a fixture): every C file in it
    srcs=$(find . -type f \( -name '*.c' -o -name '*.h' \) | sed 's|^\./||' | grep -v '^tests/node/' | sort)
fi
found=0
report() { echo "$1"; found=1; }

for f in $srcs; do
    [ -f "$f" ] || continue
    # Banned calls (comments and strings are not excluded: rename instead).
    while IFS=: read -r ln rest; do
        report "$f:$ln: banned function: $(echo "$rest" | grep -oE '\b(sprintf|vsprintf|strcpy|strcat|strtok|atoi|atol|gets)\s*\(' | head -1 | tr -d ' (')"
    done < <(grep -nE '(^|[^_a-zA-Z0-9])(sprintf|vsprintf|strcpy|strcat|strtok|atoi|atol|gets)\s*\(' "$f" | grep -vE '^[0-9]+:\s*(\*|//|/\*)')
    n=$(wc -l < "$f")
    [ "$n" -gt 1500 ] && report "$f:1: file has $n lines (limit 1500): split it by responsibility"
    # Library code: no getenv/exit outside main.c and tests/bench/tools.
    case $f in
        */main.c|tests/*|bench/*|tools/*) ;;
        *) while IFS=: read -r ln _; do
               report "$f:$ln: getenv()/exit() in library code: take it as an argument / return an error"
           done < <(grep -nE '(^|[^_a-zA-Z0-9])(getenv|exit)\s*\(' "$f" | grep -vE '^[0-9]+:\s*(\*|//|/\*)' | grep -v 'lint: allow') ;;
    esac
done

# Function length: a function starts at a line beginning with an identifier
# and ending with ')' followed by a line '{' at column 0, and ends at the
# next '}' at column 0.
for f in $srcs; do
    case $f in *.c) ;; *) continue ;; esac
    awk -v file="$f" '
        /^[A-Za-z_].*\)[ \t]*$/ { sig = FNR; name = $0; next }
        /^\{/ { if (sig == FNR - 1) { start = FNR; fn = name } next }
        /^\}/ { if (start) { len = FNR - start - 1;
                  if (len > 120) { sub(/\(.*/, "", fn); n = split(fn, w, /[ \t*]+/);
                      printf "%s:%d: function %s has %d lines (limit 120): split it\n", file, start, w[n], len }
                  start = 0 } }
    ' "$f" | while read -r line; do echo "$line"; echo x >> "${TMPDIR:-/tmp}/shoal-lint.$$"; done
done
if [ -s "${TMPDIR:-/tmp}/shoal-lint.$$" ]; then found=1; fi
rm -f "${TMPDIR:-/tmp}/shoal-lint.$$"

# ---- rooms ------------------------------------------------------------------
# A room is a folder of one purpose: common/ fetcher/ cache/ daemon/, each
# engine/<room>/ and each tools/<tool>/.  Its *_int.h is private to it.
# The engine's rooms, and which other engine rooms each may include (the
# direction reads top to bottom: cli -> serve -> source -> forward ->
# kernels; plan is arithmetic every room above kernels may use; text
# stands alone).  Keep this table and docs/README.md's map
# saying the same.
engine_rooms="text kernels plan forward source serve ranks cli"
may_use() {
    case $1 in
        text|kernels|plan) echo "" ;;
        forward) echo "plan kernels" ;;
        source)  echo "plan forward kernels" ;;
        serve)   echo "text plan forward source kernels" ;;
        ranks)   echo "plan forward source kernels" ;;   # MPI: docs/mpi.md
        cli)     echo "text kernels plan forward source serve ranks" ;;
    esac
}
# Headers of common/ that only the daemon client side may use: the wire
# protocol and the socket client.  Text, kernels and the forward pass know
# neither shoald nor its protocol.
no_daemon_client="text kernels plan forward ranks"

# The room a file belongs to ("" when none): a test of a component is in
# that component's room; a fuzz target may see the private headers of the
# sources it names in its fuzz-sources line.
room_of() {
    case $1 in
        common/*|fetcher/*|cache/*|daemon/*|synth/*) echo "${1%%/*}" ;;
        engine/*/*|tools/*/*) echo "$1" | cut -d/ -f1-2 ;;
        tests/unit/*/*)
            local c; c=$(echo "$1" | cut -d/ -f3)
            case " common fetcher cache daemon synth " in
                *" $c "*) echo "$c" ;;
                *) case " $engine_rooms " in *" $c "*) echo "engine/$c" ;; *) echo "tools/$c" ;; esac ;;
            esac ;;
        tests/fuzz/*.c)
            grep -o 'fuzz-sources:.*' "$1" | head -n 1 | sed 's/fuzz-sources://; s/\*\/.*//' \
                | tr ' ' '\n' | grep . | sed 's|/[^/]*\.c$||; s|/$||' | sort -u | tr '\n' ' ' ;;
    esac
}

for f in $srcs; do
    [ -f "$f" ] || continue
    rooms=$(room_of "$f")
    er=
    case $f in
        engine/*/*) er=$(echo "$f" | cut -d/ -f2)
                    case " $engine_rooms " in *" $er "*) ;; *)
                        report "$f:1: engine/$er/ is not a room of the engine: add it to scripts/lint.sh's table and docs/README.md, or move the file into a room"
                        er= ;;
                    esac ;;
        engine/*) report "$f:1: a file on engine/'s floor: put it in the room it belongs to (docs/README.md)" ;;
    esac
    while IFS=: read -r ln inc; do
        inc=$(echo "$inc" | sed 's/^[^"]*"//; s/".*//')
        # 1. private headers stay in their room
        case $inc in
            *_int.h)
                d=${inc%/*}
                case " $rooms " in
                    *" $d "*) ;;
                    *) report "$f:$ln: includes $inc, the private header of $d/: only $d/ may (others use its public header)" ;;
                esac ;;
        esac
        [ -n "$er" ] || continue
        # 2. the engine's directions
        case $inc in
            engine/*/*)
                r2=$(echo "$inc" | cut -d/ -f2)
                [ "$r2" = "$er" ] && continue
                case " $(may_use "$er") " in
                    *" $r2 "*) ;;
                    *) uses="common/"
                       for u in $(may_use "$er"); do uses="$uses engine/$u/"; done
                       report "$f:$ln: engine/$er/ may not include $inc (it may use: $uses)" ;;
                esac ;;
            fetcher/*|cache/*|daemon/*)
                report "$f:$ln: the engine may not include $inc (it never links fetcher/, cache/ or daemon/)" ;;
            common/client.h|common/proto.h)
                case " $no_daemon_client " in
                    *" $er "*) report "$f:$ln: engine/$er/ may not include $inc: it knows neither shoald nor its protocol (engine/source/ does)" ;;
                esac ;;
        esac
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f")
done

if [ $found -eq 0 ]; then
    echo "lint: clean ($(echo "$srcs" | wc -w) files)"
fi
exit $found
