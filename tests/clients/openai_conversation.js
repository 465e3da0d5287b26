// openai_conversation.js — a three-turn chat through the official `openai`
// client; each turn sends the whole history back, as clients do.  The
// second and third requests must continue from the saved state: their
// usage.prompt_tokens_details.cached_tokens is the previous prompt's length
// and the server's stats (GET /health) say only the new tokens were computed.
//
//   node openai_conversation.js --base http://127.0.0.1:PORT/v1 --model NAME
//        [--key KEY] [--think 0|1]
//
// Prints one line per turn and, last, "turn3_computed N prompt M".
"use strict";
const path = require("path");
const assert = require("assert");

const args = { think: "1" };
for (let i = 2; i < process.argv.length; i += 2)
    args[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
const OpenAI = require(path.join(__dirname, "..", "node", "node_modules", "openai"));
const client = new OpenAI({ baseURL: args.base, apiKey: args.key || "none", maxRetries: 0 });
const healthUrl = args.base.replace(/\/v1\/?$/, "") + "/health";

async function health() {
    const r = await fetch(healthUrl);
    assert.strictEqual(r.status, 200);
    return (await r.json()).generation;
}

async function main() {
    const extra = args.think === "0" ? { reasoning_effort: "none" } : {};
    const history = [{ role: "system", content: "You are terse." }];
    const users = ["Name three rivers in Europe.", "Which is the longest?", "And the shortest one?"];
    let prev = 0, last = null;
    for (let turn = 0; turn < 3; turn++) {
        history.push({ role: "user", content: users[turn] });
        const r = await client.chat.completions.create({ model: args.model, messages: history,
                                                         max_tokens: 6, ...extra });
        const g = await health();
        const p = r.usage.prompt_tokens, cached = r.usage.prompt_tokens_details.cached_tokens;
        console.log(`turn ${turn + 1}: prompt ${p}, cached ${cached}, computed ${g.last_computed_tokens}`);
        assert.strictEqual(g.last_reused_tokens, cached);
        assert.strictEqual(g.last_reused_tokens + g.last_computed_tokens, p);
        if (turn > 0) {
            // at least the previous prompt; more when the start of the
            // previous reply re-tokenizes to the ids that were generated
            // (their state is saved too), at most its max_tokens
            assert(cached >= prev && cached <= prev + 6,
                   `turn ${turn + 1} should continue from turn ${turn}'s prompt (${cached} vs ${prev})`);
            assert.strictEqual(g.last_computed_tokens, p - cached);
            assert(g.last_computed_tokens < p / 2, "most of the prompt must be reused");
        }
        history.push({ role: "assistant", content: r.choices[0].message.content });
        prev = p;
        last = g;
    }
    console.log(`turn3_computed ${last.last_computed_tokens} prompt ${prev}`);
}

main().catch((e) => { console.error("FAIL:", e); process.exit(1); });
