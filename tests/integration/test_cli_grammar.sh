#!/usr/bin/env bash
# test_cli_grammar.sh — one grammar and one progress display across every
# binary (docs/cli.md), checked on the real binaries:
#   - --version prints "NAME VERSION" (common/version.h) and exits 0;
#     --help / -h print a usage on stdout and exit 0, every shoal command too
#   - an unknown option exits 2 with "unrecognized option '--bogus'"; a
#     missing value "needs a value"; a flag given a value "takes no value"
#   - --opt=value means what --opt value does (a bad value is named, a good
#     one takes effect), in every binary
#   - a malformed model name exits 2 in shoal, shoal-fetch and hubget
#   - the exit-code table in docs/cli.md is the one common/cli.h defines
#   - progress: a pipe gets plain lines and never a '\r' (mkmodel,
#     shoal-fetch --progress, shoal warm --wait); a terminal gets the bar
#     redrawn with '\r'; NO_COLOR drops its colour; HF_HUB_DISABLE_PROGRESS_BARS
#     and --quiet drop it
source "$(dirname "$0")/lib.sh"

VERSION=$(sed -n 's/^#define SHOAL_VERSION "\(.*\)"/\1/p' "$ROOT/common/version.h")
BINS="shoald shoal shoal-engine shoal-fetch shoalc hubget stinfo mkmodel hubmock"
for b in $BINS; do [ -x "$BIN/$b" ] || fail "$BIN/$b not built"; done

# expect CODE REGEX what -- CMD...: exit CODE, REGEX on stderr (or stdout)
expect() {
    local code=$1 re=$2 what=$3 rc; shift 4
    "$@" >"$T/out" 2>"$T/err"; rc=$?
    [ "$rc" = "$code" ] || fail "$what: exit $rc, not $code: $(cat "$T/err" "$T/out" | head -5)"
    [ -z "$re" ] || grep -qE -- "$re" "$T/err" "$T/out" \
        || fail "$what: output lacks /$re/: $(cat "$T/err" "$T/out" | head -5)"
}

# ---- --version, --help, an unknown option ------------------------------------------------
for b in $BINS; do
    expect 0 "^$b $VERSION\$" "$b --version" -- "$BIN/$b" --version
    expect 0 '^usage: ' "$b --help" -- "$BIN/$b" --help
    [ ! -s "$T/err" ] || fail "$b --help wrote to stderr"
    expect 0 '^usage: ' "$b -h" -- "$BIN/$b" -h
    expect 2 "^$b: unrecognized option '--bogus' \\(see $b --help\\)" "$b --bogus" -- "$BIN/$b" --bogus
    expect 2 "unrecognized option '--bogus'" "$b --bogus=1" -- "$BIN/$b" --bogus=1
    "$BIN/$b" --help-man > "$T/man" || fail "$b --help-man"
    grep -q '^\.TH ' "$T/man" || fail "$b --help-man is no man page"
    "$BIN/$b" --help-completion > "$T/comp" && bash -n "$T/comp" || fail "$b --help-completion"
done
for c in stats ls warm verify gc pin unpin rm export heatmap estimate; do
    expect 0 "^usage: shoal $c" "shoal $c --help" -- "$BIN/shoal" "$c" --help
    expect 2 "^shoal $c: unrecognized option '--bogus'" "shoal $c --bogus" -- "$BIN/shoal" "$c" --bogus
done
for c in run serve plan tokenize; do
    expect 0 "^usage: shoal-engine $c" "shoal-engine $c --help" -- "$BIN/shoal-engine" "$c" --help
    expect 2 "unrecognized option '--bogus'" "shoal-engine $c --bogus" -- "$BIN/shoal-engine" "$c" --bogus
done
expect 0 "^usage: shoal warm" "shoal help warm" -- "$BIN/shoal" help warm
expect 2 "no command 'frob'" "shoal frob" -- "$BIN/shoal" frob

# ---- missing values, values on flags, ambiguous prefixes -----------------------------------
expect 2 "option '--home' needs a value \\(DIR\\)" "shoald --home" -- "$BIN/shoald" --home
expect 2 "option '--json' takes no value" "stinfo --json=1" -- "$BIN/stinfo" --json=1 x
expect 2 "option '--ver' is ambiguous \\(--verbose, --version\\)" "hubget --ver" -- "$BIN/hubget" --ver
expect 2 "option '-o' needs a value" "hubget -o" -- "$BIN/hubget" hf://a/b f -o

# ---- --opt=value --------------------------------------------------------------------------
H=$T/home
expect 2 "--log-level takes error\\|warn\\|info\\|debug\\|trace, not 'loud'" "shoald --log-level=loud" \
    -- "$BIN/shoald" --home="$H" --log-level=loud
expect 2 "bad value for --parallel: x" "shoal-fetch --parallel=x" -- "$BIN/shoal-fetch" --parallel=x m
expect 2 "bad value for --max-size: huge" "shoal-fetch --max-size=huge" -- "$BIN/shoal-fetch" --max-size=huge m
expect 2 "--range wants A-B" "hubget --range=9-1" -- "$BIN/hubget" --range=9-1 hf://a/b f
expect 2 "bad value for --preset: big" "mkmodel --preset=big" -- "$BIN/mkmodel" --preset=big --out "$T/x"
expect 2 "bad value for --port: x" "hubmock --port=x" -- "$BIN/hubmock" --port=x --synth a/b=tiny
expect 2 "bad value for --batch: 0" "shoalc --batch=0" -- "$BIN/shoalc" --batch=0 stats
expect 2 "bad value for --by: rows" "shoal stats --by=rows" -- "$BIN/shoal" --home="$H" stats --by=rows
expect 2 "bad value for --ram: lots" "shoal-engine plan --ram=lots" -- "$BIN/shoal-engine" plan --ram=lots m
# a good --opt=value takes effect
expect 0 "" "mkmodel --out=DIR" -- "$BIN/mkmodel" --out="$T/m" --layers=2 --experts=4 --quiet
[ -f "$T/m/config.json" ] || fail "mkmodel --out=DIR wrote nothing there"
grep -q '"num_hidden_layers": 2' "$T/m/config.json" || fail "--layers=2 did not take"
SHARD=$(ls "$T"/m/model-00001-of-*.safetensors | head -n 1)
expect 0 "" "stinfo --json" -- "$BIN/stinfo" "$SHARD" --json
grep -q '"tensors"' "$T/out" || fail "stinfo FILE --json (an option after the argument) printed no JSON"
expect 4 "no shoal cache in $H" "shoal --home=DIR" -- "$BIN/shoal" --home="$H" ls

# ---- malformed names: usage errors everywhere -------------------------------------------
expect 2 "is not a model" "shoal stats hf://org" -- "$BIN/shoal" --home="$H" stats hf://org
expect 2 "is not a model" "shoal warm org" -- "$BIN/shoal" --home="$H" warm 'org'
expect 2 "the repo must be org/name" "shoal-fetch hf://org" -- "$BIN/shoal-fetch" --home="$H" hf://org
expect 2 "the repo must be org/name" "hubget hf://org" -- "$BIN/hubget" hf://org f

# ---- the exit-code table: docs/cli.md says what common/cli.h defines ---------------------
codes=$(sed -n 's/.*SHOAL_EXIT_[A-Z]* *= *\([0-9]*\),\{0,1\} .*/\1/p' "$ROOT/common/cli.h" | sort -n | tr '\n' ' ')
docs=$(sed -n '/^## Exit codes/,/^## /s/^| \([0-9][0-9]*\) |.*/\1/p' "$ROOT/docs/cli.md" | sort -n | tr '\n' ' ')
[ "$codes" = "$docs" ] || fail "exit codes: common/cli.h has '$codes', docs/cli.md '$docs'"
"$BIN/shoal" --help-man | grep -q '^\.B 8$' || fail "the man page's EXIT STATUS lacks 8"

# ---- progress: pipes get lines, terminals get the bar -------------------------------------
has_cr() { grep -q $'\r' "$1"; }
"$BIN/mkmodel" --out "$T/slice" --preset slice --layers 2 --experts 4 2> "$T/mk.err" | cat
has_cr "$T/mk.err" && fail "mkmodel wrote a carriage return into a pipe"
grep -Eq '^mkmodel shard [0-9]+/[0-9]+ +[0-9.]+ %' "$T/mk.err" \
    || fail "mkmodel shows no progress lines on a pipe: $(head -3 "$T/mk.err")"
HF_HUB_DISABLE_PROGRESS_BARS=1 "$BIN/mkmodel" --out "$T/s2" --preset slice --layers 2 --experts 4 \
    2> "$T/mk2.err"
grep -q ' %' "$T/mk2.err" && fail "HF_HUB_DISABLE_PROGRESS_BARS=1: mkmodel still shows progress"
# a terminal (script gives mkmodel a pseudo-terminal): the bar, in colour unless NO_COLOR
script -qec "$BIN/mkmodel --out $T/s3 --preset slice --layers 2 --experts 4" /dev/null > "$T/tty.out"
has_cr "$T/tty.out" && grep -q '\[.*#' "$T/tty.out" || fail "no bar on a terminal"
grep -q $'\033\\[32m' "$T/tty.out" || fail "the bar has no colour on a terminal"
NO_COLOR=1 script -qec "$BIN/mkmodel --out $T/s4 --preset slice --layers 2 --experts 4" /dev/null \
    > "$T/tty2.out"
grep -q $'\033' "$T/tty2.out" && fail "NO_COLOR=1: the bar still has escape sequences"

start_hubmock --synth t/tiny=tiny,layers=4,experts=16 --synth-cache none --bw 400000
export HF_ENDPOINT=$HUB
"$BIN/shoal-fetch" --home "$T/fh" --no-fsync --experts all --spine --progress hf://t/tiny \
    > "$T/f.out" 2> "$T/f.err" || fail "shoal-fetch: $(tail -3 "$T/f.err")"
has_cr "$T/f.err" && fail "shoal-fetch --progress wrote a carriage return into a pipe"
grep -Eq '^fetch +100\.0 %.*objects' "$T/f.err" || fail "shoal-fetch --progress: no final line: $(tail -3 "$T/f.err")"

# shoal-fetch beside a running shoald: what to do instead
bg shoald "$BIN/shoald" --home "$T/fh" --no-fsync
wait_line "$T/shoald.log" 'shoald ready' 20 || fail "shoald did not start"
expect 6 "shoald owns the cache .*: use \`shoal --home .* warm hf://t/tiny\`.*or stop shoald first" \
    "shoal-fetch with shoald running" -- "$BIN/shoal-fetch" --home "$T/fh" hf://t/tiny

curl -fsS -X POST "$HUB/_mock/faults?bw=0" > /dev/null
"$BIN/shoal" --home "$T/fh" warm hf://t/tiny --experts all --wait > "$T/w.out" 2> "$T/w.err" \
    || fail "shoal warm --wait: $(cat "$T/w.err")"
has_cr "$T/w.err" && fail "shoal warm --wait wrote a carriage return into a pipe"
grep -Eq '^warm +100\.0 %' "$T/w.err" || fail "warm --wait: no progress line: $(cat "$T/w.err")"
"$BIN/shoal" --home "$T/fh" -q warm hf://t/tiny --spine --wait > "$T/w2.out" 2> "$T/w2.err" \
    || fail "shoal -q warm --wait"
grep -q ' %' "$T/w2.err" && fail "shoal -q: warm still shows progress"
grep -q '^Warm complete' "$T/w2.out" || fail "shoal -q: no result line"
echo "ok: one grammar in $(echo $BINS | wc -w) binaries; progress on pipes and terminals"
