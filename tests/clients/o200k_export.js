// o200k_export.js — writes js-tiktoken's o200k_base (or another) ranks as a standard
// tiktoken file ("base64 rank" per line, ascending rank) to stdout, so the
// C tokenizer can load the very vocabulary js-tiktoken uses.
//
// js-tiktoken ships ranks in a compact form: lines "<prefix> <offset> <b64>
// <b64> ...", each base64 token taking rank offset + i (its own decoder in
// dist/lite.cjs does the same expansion).
//   node o200k_export.js [encoding]   (default o200k_base)
"use strict";
const path = require("path");
const name = process.argv[2] || "o200k_base";
const nm = path.join(__dirname, "..", "node", "node_modules");
const ranks = require(path.join(nm, "js-tiktoken", "dist", "ranks", name + ".cjs"));

const out = [];
for (const line of ranks.bpe_ranks.split("\n")) {
    if (!line) continue;
    const [, offsetStr, ...tokens] = line.split(" ");
    const offset = Number.parseInt(offsetStr, 10);
    tokens.forEach((tok, i) => out.push([offset + i, tok]));
}
out.sort((a, b) => a[0] - b[0]);
const seen = new Set();
const lines = [];
for (const [rank, tok] of out) {
    if (seen.has(rank)) throw new Error(`rank ${rank} twice`);
    seen.add(rank);
    lines.push(`${tok} ${rank}`);
}
process.stdout.write(lines.join("\n") + "\n");
process.stderr.write(`${name}: ${lines.length} ranks; pattern ${JSON.stringify(ranks.pat_str)}\n`);
