// tok_corpus.js — a seeded, deterministic corpus of strings that stress a
// tiktoken-style tokenizer: CJK, emoji and ZWJ sequences, combining marks,
// CRLF, long runs of spaces and newlines, digits in several scripts,
// contractions with various apostrophes and cases, code, mixed scripts and
// random code points from several Unicode blocks.
//
//   node tok_corpus.js [--count N] [--seed S]      one JSON string per line
//   node tok_corpus.js --bench-bytes N [--seed S]  N bytes of mixed raw text
//
// Left out on purpose, because the reference (js-tiktoken on JavaScript's
// RegExp) and tiktoken itself (Rust regex) disagree on them, and shoal
// follows tiktoken:
//   U+0085 (NEL) is \s in Rust and PCRE2 but not in JavaScript;
//   U+FEFF (BOM) is \s in JavaScript only;
//   U+017F (long s) matches (?i:'s) in tiktoken, but js-tiktoken spells
//   the contractions out as 's|'S.
// Also left out: lone surrogates (not Unicode scalar values, cannot be
// UTF-8), NUL (the --in-json transport), and code points first assigned
// after Unicode 14 (PCRE2 10.42's tables) where they would be letters,
// marks or numbers: the blocks below predate it.
"use strict";

function parseArgs() {
    const a = { count: 2400, seed: 20261129, benchBytes: 0 };
    for (let i = 2; i < process.argv.length; i++) {
        const k = process.argv[i], v = process.argv[i + 1];
        if (k === "--count") a.count = Number(v), i++;
        else if (k === "--seed") a.seed = Number(v), i++;
        else if (k === "--bench-bytes") a.benchBytes = Number(v), i++;
        else throw new Error("unknown argument " + k);
    }
    return a;
}

// mulberry32: small, seeded, deterministic.
function rng(seed) {
    let s = seed >>> 0;
    const next = () => {
        s = (s + 0x6D2B79F5) >>> 0;
        let t = s;
        t = Math.imul(t ^ (t >>> 15), t | 1);
        t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
    return {
        f: next,
        int: (n) => Math.floor(next() * n),
        pick: (arr) => arr[Math.floor(next() * arr.length)],
    };
}

const EXCLUDED = new Set([0x85, 0xfeff, 0x17f, 0]);
const BLOCKS = [
    [0x20, 0x7e], [0xa0, 0xff], [0x100, 0x17f], [0x180, 0x24f], [0x300, 0x36f],
    [0x370, 0x3ff], [0x400, 0x4ff], [0x530, 0x58f], [0x590, 0x5ff], [0x600, 0x6ff],
    [0x900, 0x97f], [0x980, 0x9ff], [0xe00, 0xe7f], [0x10a0, 0x10ff], [0x1100, 0x11ff],
    [0x1e00, 0x1eff], [0x2000, 0x206f], [0x2070, 0x209f], [0x20a0, 0x20bf], [0x2100, 0x214f],
    [0x2150, 0x218f], [0x2190, 0x21ff], [0x2200, 0x22ff], [0x2500, 0x257f], [0x2600, 0x26ff],
    [0x3000, 0x303f], [0x3040, 0x309f], [0x30a0, 0x30ff], [0x3100, 0x312f], [0x4e00, 0x9ffc],
    [0xac00, 0xd7a3], [0xf900, 0xfaff], [0xff00, 0xffef], [0x1d400, 0x1d7ff], [0x1f300, 0x1f64f],
    [0x1f680, 0x1f6ff], [0x1f900, 0x1f9ff], [0x20000, 0x2a6df],
];

function cp(r) {
    for (;;) {
        const [lo, hi] = r.pick(BLOCKS);
        const c = lo + r.int(hi - lo + 1);
        if (!EXCLUDED.has(c) && !(c >= 0xd800 && c <= 0xdfff)) return String.fromCodePoint(c);
    }
}

const WORDS_EN = ["the", "The", "THE", "capital", "of", "France", "is", "Paris", "hello", "Hello",
    "world", "tokenizer", "don", "can", "won", "I", "you", "they", "we", "it", "HTTP", "JSONParser",
    "naïve", "café", "résumé", "über", "Straße", "coöperate", "ﬁle", "x", "a", "an"];
const CONTRACTIONS = ["'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'rE", "'ve", "'VE", "'m", "'M",
    "'ll", "'LL", "'lL", "'d", "'D", "’s", "’t", "'", "''", "'x", "'sa", "'dd"];
const CJK = ["中文分词测试", "日本語のテキストです。", "東京都", "한국어 문장입니다", "我爱北京天安门",
    "漢字かなカナ", "々〆〻", "〼", "𠀀𠀁𪚥", "中\u302a文", "ｶﾀｶﾅ", "ｈｅｌｌｏ　ｗｏｒｌｄ", "。、「」『』"];
const EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷🇯🇵", "1️⃣", "❤️", "🧑🏿‍🚀", "👩‍💻", "🤷‍♂️",
    "☺︎", "✈️", "🫠", "🦀🦀🦀", "💯", "⚠"];
const MARKS = ["e\u0301", "a\u0308\u0304", "\u0301\u0301\u0301", "n\u0303", "ก\u0e34\u0e48",
    "क\u094d\u0937", "\u05e9\u05c1\u05b8", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d", "o\u20dd"];
const CODE = [
    "int main(void) {\n    return 0;\n}\n",
    "for (size_t i = 0; i < n; i++) x[i] += y[i] * 2.5f;",
    "def f(x):\n\treturn x**2  # square\n",
    "const re = /[a-z]+/gi; // regex\r\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<div class=\"a\">&amp;&lt;</div>",
    "{\"key\": [1, 2.5e-3, true, null], \"k2\": \"v\"}",
    "if x != nil {\n\t\treturn fmt.Errorf(\"bad: %w\", err)\n\t}",
    "$ ls -la /usr/local/bin | grep -v '^d' > out.txt 2>&1",
    "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))",
    "fn main() { println!(\"{:?}\", vec![1u8; 3]); }",
    "    \n        \n",
    "a/b/c//d///e", "https://example.com/path?q=1&r=2#frag", "x=1;y=2;;z",
    "<|endoftext|>", "<|open|>user<|sep|>", "[BOS]",
];
const DIGITS = ["0", "12", "123", "1234", "12345678901234567890", "3.14159", "1,000,000",
    "٠١٢٣٤٥٦٧٨٩", "०१२३४५", "１２３４５", "²³½¾", "ⅫⅣ", "12abc", "abc123def", "0x1F600", "1e-9"];
const SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u3000", "\u2003",
    "\u2028", "\u000b", "\u000c", "\u200b", "\u200d", "\u00ad", "\u200f"];

function word(r) {
    switch (r.int(8)) {
    case 0: return r.pick(WORDS_EN) + r.pick(CONTRACTIONS);
    case 1: return r.pick(CJK);
    case 2: return r.pick(EMOJI);
    case 3: return r.pick(MARKS);
    case 4: return r.pick(DIGITS);
    case 5: { let s = ""; const n = 1 + r.int(6); for (let i = 0; i < n; i++) s += cp(r); return s; }
    case 6: return r.pick(CODE);
    default: return r.pick(WORDS_EN);
    }
}

function sep(r) {
    const x = r.f();
    if (x < 0.7) return " ";
    if (x < 0.85) return r.pick(SPACES);
    if (x < 0.9) return r.pick([",", ".", "!", "?", ";", ":", "-", "—", "…", "\"", "(", ")"]);
    return "";
}

function sentence(r, words) {
    let s = "";
    for (let i = 0; i < words; i++) s += word(r) + sep(r);
    return s;
}

// Strings of one kind each, then mixtures.
function makeString(r, i) {
    switch (i % 16) {
    // js-tiktoken's merge loop is quadratic in a piece's length: a few long
    // runs, many short ones, to keep the reference's time reasonable.
    case 0: return " ".repeat(1 + r.int(r.f() < 0.08 ? 3000 : 200)) + (r.f() < 0.5 ? "x" : "");
    case 1: return "\n".repeat(1 + r.int(200)) + (r.f() < 0.5 ? " " : "") + sentence(r, 2);
    case 2: { let s = ""; const n = 1 + r.int(40); for (let k = 0; k < n; k++) s += r.pick(SPACES); return s + sentence(r, 1); }
    case 3: return sentence(r, 1 + r.int(8)).replace(/\n/g, "\r\n");
    case 4: { let s = ""; const n = 1 + r.int(30); for (let k = 0; k < n; k++) s += cp(r); return s; }
    case 5: { let s = ""; const n = 1 + r.int(12); for (let k = 0; k < n; k++) s += r.pick(EMOJI) + (r.f() < 0.3 ? " " : ""); return s; }
    case 6: { let s = ""; const n = 1 + r.int(10); for (let k = 0; k < n; k++) s += r.pick(CJK) + (r.f() < 0.3 ? r.pick(WORDS_EN) : ""); return s; }
    case 7: { let s = ""; const n = 1 + r.int(10); for (let k = 0; k < n; k++) s += r.pick(WORDS_EN) + r.pick(CONTRACTIONS) + sep(r); return s; }
    case 8: { let s = ""; const n = 1 + r.int(6); for (let k = 0; k < n; k++) s += r.pick(CODE); return s; }
    case 9: { let s = ""; const n = 1 + r.int(10); for (let k = 0; k < n; k++) s += r.pick(DIGITS) + (r.f() < 0.5 ? "" : sep(r)); return s; }
    case 10: { let s = ""; const n = 1 + r.int(10); for (let k = 0; k < n; k++) s += r.pick(MARKS) + (r.f() < 0.5 ? cp(r) : ""); return s; }
    case 11: return r.pick(["a", "ab", "!", "🦀", "中", "é", "  ", ".", "'", "\u0301"]).repeat(1 + r.int(500));
    case 12: return sentence(r, 1 + r.int(3));
    default: return sentence(r, 3 + r.int(30));
    }
}

const args = parseArgs();
const r = rng(args.seed);
if (args.benchBytes > 0) {
    // Mixed text for throughput: mostly prose-like mixtures, some code.
    const parts = [];
    let bytes = 0, i = 0;
    while (bytes < args.benchBytes) {
        const s = i % 4 === 3 ? r.pick(CODE) + "\n" : sentence(r, 5 + r.int(40)) + "\n";
        parts.push(s);
        bytes += Buffer.byteLength(s, "utf8");
        i++;
    }
    process.stdout.write(parts.join(""));
} else {
    const fixed = ["", " ", "\n", "\r\n", "Hello, world!", "The capital of France is", "Hello\n\nworld  ",
        "a <|open|> b [BOS] c", "I'm don't you'RE they'Ve", "   leading", "trailing   ", "\t\t\n\n  \n",
        "😀", "👨‍👩‍👧‍👦", "e\u0301", "中文", "1234567", "a\u00a0b", "x\u3000y", "a\u2028b"];
    const out = fixed.map((s) => JSON.stringify(s));
    for (let i = 0; out.length < args.count; i++) out.push(JSON.stringify(makeString(r, i)));
    process.stdout.write(out.join("\n") + "\n");
}
