#!/usr/bin/env bash
# bench/tokenizer/run.sh — tokenizer throughput on mixed text: shoal's
# encoder vs js-tiktoken on the same corpus (o200k_base, loaded into shoal
# from a tiktoken file with o200k's pattern), measured in the same run.
# Each side times only its encode calls (best of several), not process
# start-up or vocabulary loading.  Also checks both produced the same number
# of tokens.  Records tokenizer.encode_o200k (MB/s, target ratio >= 1).
#   BENCH_TOKENIZER_MB (default 4): size of the mixed text
set -u
cd "$(dirname "$0")/../.."
BIN=${BIN:-bin}
OUT=${SHOAL_BENCH_OUT:-bench/out/results.jsonl}
MB=${BENCH_TOKENIZER_MB:-4}
ENGINE=$BIN/shoal-engine
[ -x "$ENGINE" ] || { echo "bench/tokenizer: $ENGINE not built"; exit 1; }
command -v node >/dev/null && [ -d tests/node/node_modules/js-tiktoken ] ||
    { echo "bench/tokenizer: node and js-tiktoken are needed (make deps)"; exit 1; }
T=$(mktemp -d "${TMPDIR:-/tmp}/shoal-bench-tok.XXXXXX")
trap 'rm -rf "$T"' EXIT

node tests/clients/o200k_export.js >"$T/o200k.tiktoken" 2>/dev/null || { echo "bench/tokenizer: export failed"; exit 1; }
node tests/clients/tok_corpus.js --bench-bytes $((MB * 1000000)) --seed 99 >"$T/text.txt" || exit 1

shoal=$("$ENGINE" tokenize --vocab "$T/o200k.tiktoken" --pattern o200k --no-slice --bench "$T/text.txt" --repeat 5) ||
    { echo "bench/tokenizer: shoal-engine failed"; exit 1; }
js=$(node bench/tokenizer/js_bench.js "$T/text.txt" --repeat 2) || { echo "bench/tokenizer: js-tiktoken failed"; exit 1; }
echo "shoal:       $shoal"
echo "js-tiktoken: $js"

field() { echo "$1" | awk -v k="$2" '{for (i = 1; i < NF; i++) if ($i == k) print $(i + 1)}'; }
s_mbs=$(field "$shoal" mb_per_s); j_mbs=$(field "$js" mb_per_s)
s_tok=$(field "$shoal" tokens); j_tok=$(field "$js" tokens)
[ "$s_tok" = "$j_tok" ] || { echo "bench/tokenizer: token counts differ (shoal $s_tok, js $j_tok)"; exit 1; }

ratio=$(awk -v a="$s_mbs" -v b="$j_mbs" 'BEGIN {printf "%.6g", (b > 0) ? a / b : 0}')
verdict=$(awk -v r="$ratio" 'BEGIN {print (r >= 1) ? "ok" : "BELOW TARGET"}')
printf '%-40s %12.4g %-6s vs %s %.4g %s  ratio %.3f (target >= 1.00) %s\n' tokenizer.encode_o200k \
    "$s_mbs" MB/s "js-tiktoken" "$j_mbs" MB/s "$ratio" "$verdict"
mkdir -p "$(dirname "$OUT")"
printf '{"name":"tokenizer.encode_o200k","value":%s,"unit":"MB/s","baseline":"js-tiktoken 1.0.21, same text, same run","baseline_value":%s,"ratio":%s,"better":"higher","target":1}\n' \
    "$s_mbs" "$j_mbs" "$ratio" >>"$OUT"
