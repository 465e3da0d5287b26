// openai_fields.js — the official `openai` npm client against a running
// `shoal-engine serve`: the fields off-the-shelf clients send and the
// sampling fields people use (tests/integration/test_server.sh starts it).
//
//   node openai_fields.js --base http://127.0.0.1:PORT/v1 --model NAME --key KEY
//
// Checks: no-op values (tools [], store false, metadata, response_format
// text, parallel_tool_calls, tool_choice none, logprobs false) are accepted
// and change nothing; top_k, min_p, repetition/presence/frequency penalties
// change the text and stay reproducible under a seed; min_tokens and
// stop_token_ids; logprobs in OpenAI's chat and completions shapes, whole
// and streamed; anything else is a 400 naming the field.  Exits 1 on the
// first failure.
"use strict";
const assert = require("assert");
const { parseArgs, OpenAI, makeClient } = require("./client_setup.js");

const args = parseArgs();
const client = makeClient(args);
const model = args.model;
const root = args.base.replace(/\/v1$/, "");
const msgs = [{ role: "user", content: "Tell me a story" }];
const off = { reasoning_effort: "none" };

async function chat(body) {
    const r = await client.chat.completions.create({ model, messages: msgs, ...off, ...body });
    return r.choices[0];
}

async function comp(body) {
    const r = await client.completions.create({ model, prompt: "Once upon a time", ...body });
    return { choice: r.choices[0], usage: r.usage };
}

async function expect400(fn, param) {
    try {
        await fn();
    } catch (e) {
        assert.strictEqual(e.status, 400, `${param}: status ${e.status}`);
        assert.strictEqual(e.error?.param ?? e.param, param, `${param}: param ${e.param}`);
        return;
    }
    throw new Error(`${param}: accepted`);
}

// A completion's text skips special tokens; its logprobs list them by name.
const textOf = (tokens) => tokens.filter((t) => !/^<\|[^|]*\|>$/.test(t)).join("");

async function tokenize(text) {
    const r = await fetch(`${root}/tokenize`, {
        method: "POST", headers: { "Content-Type": "application/json", Authorization: `Bearer ${args.key}` },
        body: JSON.stringify({ model, prompt: text }) });
    assert.strictEqual(r.status, 200);
    return (await r.json()).tokens;
}

async function main() {
    // ---- no-op values: accepted, nothing changes
    const base = await chat({ max_tokens: 10 });
    const noop = await chat({ max_tokens: 10, tools: [], tool_choice: "none", store: false,
                              metadata: { team: "tests" }, response_format: { type: "text" },
                              parallel_tool_calls: false, logprobs: false, top_logprobs: 0 });
    assert.strictEqual(noop.message.content, base.message.content);
    const cnoop = await comp({ max_tokens: 10, logprobs: null, best_of: 1, echo: false });
    console.log("ok no-op fields", JSON.stringify(base.message.content));

    // ---- sampling fields change the text and stay seeded (60 tokens: the
    // greedy text repeats an id by then, which the penalties then avoid)
    const plain = await comp({ max_tokens: 60 });
    assert(plain.choice.text.startsWith(cnoop.choice.text), "no-op completion fields changed the text");
    for (const [name, f] of [["repetition_penalty", { repetition_penalty: 1.8 }],
                             ["frequency_penalty", { frequency_penalty: 2 }],
                             ["presence_penalty", { presence_penalty: 2 }]]) {
        const r = await comp({ max_tokens: 60, ...f });
        assert.notStrictEqual(r.choice.text, plain.choice.text, `${name} changed nothing`);
        const again = await comp({ max_tokens: 60, ...f });
        assert.strictEqual(again.choice.text, r.choice.text, `${name}: greedy is not repeatable`);
    }
    const knobs = { temperature: 1.3, top_k: 20, top_p: 0.95, min_p: 0.02,
                    repetition_penalty: 1.2, presence_penalty: 0.5, frequency_penalty: 0.3 };
    const s1 = await comp({ max_tokens: 24, seed: 5, ...knobs });
    const s2 = await comp({ max_tokens: 24, seed: 5, ...knobs, stream: false });
    const s3 = await comp({ max_tokens: 24, seed: 6, ...knobs });
    assert.strictEqual(s1.choice.text, s2.choice.text, "same seed, same text");
    assert.notStrictEqual(s1.choice.text, s3.choice.text, "another seed, another text");
    // top_k 1 is greedy whatever the temperature
    const k1 = await comp({ max_tokens: 60, temperature: 2, top_k: 1, seed: 9 });
    assert.strictEqual(k1.choice.text, plain.choice.text, "top_k 1 = greedy");
    console.log("ok sampling fields, seeded", JSON.stringify(s1.choice.text.slice(0, 30)));

    // ---- min_tokens / stop_token_ids
    const mt = await comp({ max_tokens: 6, min_tokens: 6 });
    assert.strictEqual(mt.usage.completion_tokens, 6);
    await expect400(() => comp({ max_tokens: 4, min_tokens: 5 }), "min_tokens");
    // a token of the greedy text, found by its logprobs entry and /tokenize
    const lp = await comp({ max_tokens: 24, logprobs: 0 });
    const toks = lp.choice.logprobs.tokens;
    let at = -1, id = -1;
    for (let i = 2; i < toks.length && at < 0; i++) {
        const ids = await tokenize(toks[i]);
        if (ids.length === 1 && toks.indexOf(toks[i]) === i) { at = i; id = ids[0]; }
    }
    assert(at > 0, "no token of the greedy text stands alone");
    const st = await comp({ max_tokens: 24, stop_token_ids: [id] });
    assert.strictEqual(st.choice.finish_reason, "stop");
    assert.strictEqual(st.usage.completion_tokens, at + 1, "stops at the stop id");
    assert.strictEqual(st.choice.text, textOf(toks.slice(0, at)), "the stop id adds no text");
    console.log(`ok min_tokens, stop_token_ids [${id}] (${JSON.stringify(toks[at])} at ${at})`);

    // ---- logprobs, completions: the legacy arrays
    const c2 = await comp({ max_tokens: 12, logprobs: 2 });
    const L = c2.choice.logprobs;
    assert.strictEqual(L.tokens.length, c2.usage.completion_tokens);
    assert.strictEqual(L.token_logprobs.length, L.tokens.length);
    assert.strictEqual(L.text_offset.length, L.tokens.length);
    assert.strictEqual(textOf(L.tokens), c2.choice.text);
    for (let i = 0; i < L.tokens.length; i++) {
        assert(L.token_logprobs[i] <= 0);
        const alts = Object.entries(L.top_logprobs[i]);
        assert(alts.length >= 2 && alts.length <= 3);
        // greedy: the sampled token is the most likely
        const best = Math.max(...alts.map(([, v]) => v));
        assert(Math.abs(best - L.token_logprobs[i]) < 1e-6, `token ${i} is not the argmax`);
        if (i) assert(L.text_offset[i] >= L.text_offset[i - 1]);
    }
    console.log("ok completions logprobs", JSON.stringify(L.tokens.slice(0, 4)));

    // ---- logprobs, chat: content[] with bytes and top_logprobs; the stream agrees
    const w = await chat({ max_tokens: 12, logprobs: true, top_logprobs: 3 });
    const C = w.logprobs.content;
    assert(C.length > 0);
    let mass = 0;
    for (const e of C) {
        assert.strictEqual(e.top_logprobs.length, 3);
        assert(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
        assert(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6, "greedy: the top is the token");
        mass = e.top_logprobs.reduce((a, t) => a + Math.exp(t.logprob), 0);
        assert(mass <= 1 + 1e-6);
    }
    assert.strictEqual(C.map((e) => Buffer.from(e.bytes)).reduce((a, b) => Buffer.concat([a, b]),
                       Buffer.alloc(0)).toString("utf8"), w.message.content);
    const s = await client.chat.completions.create({ model, messages: msgs, ...off, max_tokens: 12,
                                                     logprobs: true, top_logprobs: 3, stream: true });
    const streamed = [];
    for await (const c of s)
        if (c.choices[0]?.logprobs?.content) streamed.push(...c.choices[0].logprobs.content);
    assert.deepStrictEqual(streamed, C, "streamed logprobs differ from the whole reply's");
    console.log("ok chat logprobs, whole == stream", JSON.stringify(C[0].token));
    // thinking mode: the reasoning's tokens beside the answer's
    const t = await client.chat.completions.create({ model, messages: msgs, max_tokens: 12, logprobs: true });
    assert(Array.isArray(t.choices[0].logprobs.reasoning_content));
    assert(t.choices[0].logprobs.reasoning_content.length + t.choices[0].logprobs.content.length > 0);

    // ---- everything else: a 400 naming the field
    await expect400(() => chat({ tools: [{ type: "function", function: { name: "f" } }] }), "tools");
    await expect400(() => chat({ response_format: { type: "json_object" } }), "response_format");
    await expect400(() => chat({ store: true }), "store");
    await expect400(() => chat({ top_logprobs: 2 }), "top_logprobs");
    await expect400(() => chat({ logit_bias: { 5: 10 } }), "logit_bias");
    await expect400(() => comp({ min_p: 2 }), "min_p");
    await expect400(() => comp({ stop_token_ids: [99999999] }), "stop_token_ids");
    console.log("all openai field checks passed");
}

main().catch((e) => { console.error("FAIL:", e); process.exit(1); });
