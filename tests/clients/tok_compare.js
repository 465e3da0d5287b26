// tok_compare.js — checks `shoal-engine tokenize` against js-tiktoken.
//
//   node tok_compare.js --bin SHOAL_ENGINE --vocab FILE --corpus FILE
//                       [--encoding o200k_base] [--pattern o200k]
//
// The corpus holds one JSON string per line (tok_corpus.js).  For every
// string: shoal's ids must equal js-tiktoken's exactly, and shoal's decode of
// its own ids must give the string back.  Then random id sequences (which
// often cut characters apart) must decode to the same lossy text in both
// (both replace ill-formed UTF-8 by maximal subparts).  Prints the first
// mismatches with the string escaped and exits 1 on any.
"use strict";
const path = require("path");
const fs = require("fs");
const { spawnSync } = require("child_process");

const args = { encoding: "o200k_base", pattern: "o200k" };
for (let i = 2; i < process.argv.length; i += 2)
    args[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
for (const k of ["bin", "vocab", "corpus"])
    if (!args[k]) { console.error(`tok_compare: --${k} is required`); process.exit(2); }

const nm = path.join(__dirname, "..", "node", "node_modules");
const { Tiktoken } = require(path.join(nm, "js-tiktoken", "dist", "lite.cjs"));
const ranks = require(path.join(nm, "js-tiktoken", "dist", "ranks", args.encoding + ".cjs"));
const enc = new Tiktoken(ranks);

function shoal(extra, input) {
    const r = spawnSync(args.bin, ["tokenize", "--vocab", args.vocab, "--pattern", args.pattern, ...extra],
        { input, maxBuffer: 1 << 30, encoding: "utf8" });
    if (r.status !== 0) {
        console.error(`shoal-engine tokenize ${extra.join(" ")} failed (status ${r.status}):\n${r.stderr}`);
        process.exit(1);
    }
    const lines = r.stdout.split("\n");
    lines.pop();
    return lines;
}

const corpusLines = fs.readFileSync(args.corpus, "utf8").split("\n").filter((l) => l.length);
const strings = corpusLines.map((l) => JSON.parse(l));
const t0 = Date.now();
const shoalOut = shoal(["--in-json", "--json"], corpusLines.join("\n") + "\n").map((l) => JSON.parse(l));
const tShoal = Date.now() - t0;
if (shoalOut.length !== strings.length) {
    console.error(`shoal printed ${shoalOut.length} lines for ${strings.length} strings`);
    process.exit(1);
}

let bad = 0, tokens = 0;
const t1 = Date.now();
const jsOut = strings.map((s) => enc.encode(s, [], []));
const tJs = Date.now() - t1;
for (let i = 0; i < strings.length; i++) {
    const a = shoalOut[i], b = jsOut[i];
    tokens += b.length;
    if (a.length === b.length && a.every((x, k) => x === b[k])) continue;
    if (++bad <= 10) {
        let k = 0;
        while (k < a.length && k < b.length && a[k] === b[k]) k++;
        const s = strings[i];
        console.log(`MISMATCH #${i}: ${JSON.stringify(s.length > 300 ? s.slice(0, 300) + "…" : s)}`);
        console.log(`  first difference at token ${k}`);
        console.log(`  shoal:       ${JSON.stringify(a.slice(Math.max(0, k - 3), k + 8))}`);
        console.log(`  js-tiktoken: ${JSON.stringify(b.slice(Math.max(0, k - 3), k + 8))}`);
        console.log(`  js pieces:   ${JSON.stringify(b.slice(Math.max(0, k - 3), k + 8).map((t) => enc.decode([t])))}`);
    }
}
console.log(`encode: ${strings.length - bad}/${strings.length} strings equal (${tokens} tokens; ` +
    `shoal ${tShoal} ms incl. start-up, js-tiktoken ${tJs} ms)`);

// Round trip through shoal's own decoder.
const dec = shoal(["--decode", "--json"], shoalOut.map((ids) => ids.join(" ")).join("\n") + "\n")
    .map((l) => JSON.parse(l));
let badRt = 0;
for (let i = 0; i < strings.length; i++) {
    if (dec[i] === strings[i]) continue;
    if (++badRt <= 5)
        console.log(`ROUND TRIP #${i}: ${JSON.stringify(strings[i]).slice(0, 200)} -> ${JSON.stringify(dec[i]).slice(0, 200)}`);
}
console.log(`round trip: ${strings.length - badRt}/${strings.length} strings equal`);

// Lossy decoding of arbitrary id sequences: cut characters, stray bytes.
// Ids drawn from the vocabulary's own ranks (contiguous from 0 in the
// files o200k_export.js writes).
const nRanks = fs.readFileSync(args.vocab, "utf8").split("\n").filter((l) => l.length).length;
let seed = 12345;
const rand = (n) => { seed = (seed * 1103515245 + 12345) >>> 0; return seed % n; };
const seqs = [];
for (let i = 0; i < 400; i++) {
    const n = 1 + rand(12), ids = [];
    for (let k = 0; k < n; k++) ids.push(rand(3) === 0 ? 128 + rand(128) : rand(nRanks));
    seqs.push(ids);
}
const lossy = shoal(["--decode", "--json"], seqs.map((s) => s.join(",")).join("\n") + "\n").map((l) => JSON.parse(l));
let badLossy = 0;
for (let i = 0; i < seqs.length; i++) {
    const want = enc.decode(seqs[i]);
    if (lossy[i] === want) continue;
    if (++badLossy <= 5)
        console.log(`LOSSY #${i} ${JSON.stringify(seqs[i])}: shoal ${JSON.stringify(lossy[i])} js ${JSON.stringify(want)}`);
}
console.log(`lossy decode: ${seqs.length - badLossy}/${seqs.length} id sequences equal`);
process.exit(bad || badRt || badLossy ? 1 : 0);
