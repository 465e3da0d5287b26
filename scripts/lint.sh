#!/usr/bin/env bash
# make lint: the house rules a compiler does not check.
#   - banned functions: sprintf strcpy strcat strtok atoi gets (use snprintf,
#     memcpy with a length, shoal_buf, strtol/strtoull)
#   - files past 1,500 lines, functions past 120 lines
#   - getenv() and exit() outside a program's main file (library code takes
#     its configuration as arguments and returns errors)
# Prints each finding as FILE:LINE: message and exits 1 if there is any.
set -u
cd "$(dirname "$0")/.."
srcs=$(git ls-files -co --exclude-standard -- '*.c' '*.h' | grep -v '^tests/node/' | sort)
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

if [ $found -eq 0 ]; then
    echo "lint: clean ($(echo "$srcs" | wc -w) files)"
fi
exit $found
