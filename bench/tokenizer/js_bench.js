// js_bench.js — js-tiktoken's encoding throughput on a file, for
// bench/tokenizer/run.sh.  Times encode() only (not start-up or loading),
// best of --repeat runs.  Prints "bytes B tokens T seconds S mb_per_s R",
// the same line `shoal-engine tokenize --bench` prints.
//   node js_bench.js FILE [--repeat N] [--encoding o200k_base]
"use strict";
const path = require("path");
const fs = require("fs");

const file = process.argv[2];
let repeat = 2, encoding = "o200k_base";
for (let i = 3; i < process.argv.length; i += 2) {
    if (process.argv[i] === "--repeat") repeat = Number(process.argv[i + 1]);
    else if (process.argv[i] === "--encoding") encoding = process.argv[i + 1];
}
const nm = path.join(__dirname, "..", "..", "tests", "node", "node_modules");
const { Tiktoken } = require(path.join(nm, "js-tiktoken", "dist", "lite.cjs"));
const enc = new Tiktoken(require(path.join(nm, "js-tiktoken", "dist", "ranks", encoding + ".cjs")));
const buf = fs.readFileSync(file);
const text = buf.toString("utf8");
let best = Infinity, tokens = 0;
for (let r = 0; r < repeat; r++) {
    const t0 = process.hrtime.bigint();
    tokens = enc.encode(text, [], []).length;
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    if (s < best) best = s;
}
console.log(`bytes ${buf.length} tokens ${tokens} seconds ${best.toFixed(6)} mb_per_s ${(buf.length / best / 1e6).toFixed(3)}`);
