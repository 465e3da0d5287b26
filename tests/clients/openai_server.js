// openai_server.js — the official `openai` npm client against a running
// `shoal-engine serve` (tests/integration/test_server.sh starts it).
//
//   node openai_server.js --base http://127.0.0.1:PORT/v1 --model NAME --key KEY
//
// Checks: models list; chat and completions, whole and streamed, give the
// same greedy text; usage counts; reasoning_content apart from content in
// thinking mode and absent with reasoning_effort "none"; stop sequences cut
// the text exactly where the whole-text run had them (streamed too); seeded
// sampling repeats and another seed differs; errors come back as the
// client's API errors with the right status (400 unknown field, 400 n=2,
// 400 context, 401 key, 404 model).  Exits 1 on the first failure.
"use strict";
const assert = require("assert");
const { parseArgs, OpenAI, makeClient } = require("./client_setup.js");

const args = parseArgs();
const client = makeClient(args);
const model = args.model;

async function chatWhole(body) {
    const r = await client.chat.completions.create({ model, ...body });
    return { content: r.choices[0].message.content, reasoning: r.choices[0].message.reasoning_content,
             finish: r.choices[0].finish_reason, usage: r.usage };
}

async function chatStream(body) {
    const s = await client.chat.completions.create({ model, ...body, stream: true,
                                                     stream_options: { include_usage: true } });
    let content = "", reasoning = "", finish = null, usage = null, role = null, chunks = 0;
    for await (const c of s) {
        chunks++;
        if (c.usage) usage = c.usage;
        if (!c.choices.length) continue;
        const d = c.choices[0].delta;
        if (d.role) role = d.role;
        if (d.content) content += d.content;
        if (d.reasoning_content) reasoning += d.reasoning_content;
        if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    }
    return { content, reasoning, finish, usage, role, chunks };
}

async function compWhole(body) {
    const r = await client.completions.create({ model, ...body });
    return { text: r.choices[0].text, finish: r.choices[0].finish_reason, usage: r.usage };
}

async function compStream(body) {
    const s = await client.completions.create({ model, ...body, stream: true,
                                                stream_options: { include_usage: true } });
    let text = "", finish = null, usage = null;
    for await (const c of s) {
        if (c.usage) usage = c.usage;
        if (!c.choices || !c.choices.length) continue;
        text += c.choices[0].text;
        if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    }
    return { text, finish, usage };
}

async function expectError(status, fn, what, needle) {
    try {
        await fn();
    } catch (e) {
        assert(e instanceof OpenAI.APIError, `${what}: not an APIError: ${e}`);
        assert.strictEqual(e.status, status, `${what}: status ${e.status}, wanted ${status}`);
        if (needle)
            assert(String(e.message).includes(needle), `${what}: message "${e.message}" lacks "${needle}"`);
        console.log(`ok ${what}: ${e.constructor.name} ${e.status}`);
        return;
    }
    throw new Error(`${what}: no error`);
}

async function main() {
    // Models.
    const ids = [];
    for await (const m of client.models.list()) ids.push(m.id);
    assert.deepStrictEqual(ids, [model]);
    console.log("ok models");

    // Chat, thinking mode (default): whole vs stream, greedy.
    const msgs = [{ role: "user", content: "Hi there" }];
    const w = await chatWhole({ messages: msgs, max_tokens: 12 });
    const s = await chatStream({ messages: msgs, max_tokens: 12 });
    assert.strictEqual(typeof w.reasoning, "string", "reasoning_content missing in thinking mode");
    assert.strictEqual(s.content, w.content);
    assert.strictEqual(s.reasoning, w.reasoning);
    assert.strictEqual(s.role, "assistant");
    assert.strictEqual(w.usage.completion_tokens, 12);
    assert.strictEqual(w.finish, "length");
    assert(w.usage.prompt_tokens > 100, "the thinking-effort message is part of the prompt");
    assert.strictEqual(w.usage.total_tokens, w.usage.prompt_tokens + 12);
    assert.deepStrictEqual([s.usage.prompt_tokens, s.usage.completion_tokens],
                           [w.usage.prompt_tokens, w.usage.completion_tokens]);
    assert(w.reasoning.length + w.content.length > 0, "no text at all");
    console.log("ok chat whole == stream", JSON.stringify(w.reasoning.slice(0, 30)));

    // Thinking off: no reasoning_content, a shorter prompt.
    const off = await chatWhole({ messages: msgs, max_tokens: 8, reasoning_effort: "none" });
    assert.strictEqual(off.reasoning, undefined);
    assert(off.usage.prompt_tokens < w.usage.prompt_tokens);
    assert(off.content.length > 0);
    const offs = await chatStream({ messages: msgs, max_tokens: 8, reasoning_effort: "none" });
    assert.strictEqual(offs.content, off.content);
    assert.strictEqual(offs.reasoning, "");
    console.log("ok thinking off", JSON.stringify(off.content));

    // Completions, whole vs stream; prompt as text and as ids.
    const cw = await compWhole({ prompt: "The quick brown fox", max_tokens: 40 });
    const cs = await compStream({ prompt: "The quick brown fox", max_tokens: 40 });
    assert.strictEqual(cs.text, cw.text);
    assert.strictEqual(cw.usage.completion_tokens, 40);
    assert.strictEqual(cs.usage.completion_tokens, 40);
    assert.strictEqual(cw.finish, "length");
    const ci = await compWhole({ prompt: [84, 104, 101], max_tokens: 5 });
    assert.strictEqual(ci.usage.prompt_tokens, 3);
    console.log("ok completions whole == stream", JSON.stringify(cw.text.slice(0, 40)));

    // Stop sequences: cut where the unconstrained text has them.
    const full = cw.text;
    const stop = full.slice(12, 15);
    const at = full.indexOf(stop);
    assert(stop.length === 3 && at >= 0);
    for (const f of [compWhole, compStream]) {
        const r = await f({ prompt: "The quick brown fox", max_tokens: 40, stop: [stop, "NEVER-SEEN~~"] });
        assert.strictEqual(r.text, full.slice(0, at), `stop ${JSON.stringify(stop)} (${f.name})`);
        assert.strictEqual(r.finish, "stop");
        assert(r.usage.completion_tokens < 40);
    }
    const offStop = off.content.slice(2, 4);
    if (offStop.length === 2) {
        const r = await chatStream({ messages: msgs, max_tokens: 8, reasoning_effort: "none", stop: offStop });
        assert.strictEqual(r.content, off.content.slice(0, off.content.indexOf(offStop)));
        assert.strictEqual(r.finish, "stop");
    }
    console.log("ok stop sequences", JSON.stringify(stop));

    // Seeded sampling.
    const body = { prompt: "Once upon a time", max_tokens: 24, temperature: 1.0, top_p: 0.95 };
    const a = await compWhole({ ...body, seed: 1234 });
    const b = await compStream({ ...body, seed: 1234 });
    const c = await compWhole({ ...body, seed: 99 });
    const g = await compWhole({ ...body, temperature: 0 });
    assert.strictEqual(a.text, b.text, "same seed, same text");
    assert.notStrictEqual(a.text, c.text, "another seed, other text");
    assert.notStrictEqual(a.text, g.text, "sampling differs from greedy");
    const ca = await chatWhole({ messages: msgs, max_tokens: 10, temperature: 0.9, seed: 7 });
    const cb = await chatWhole({ messages: msgs, max_tokens: 10, temperature: 0.9, seed: 7 });
    assert.deepStrictEqual([ca.reasoning, ca.content], [cb.reasoning, cb.content]);
    console.log("ok seeded sampling", JSON.stringify(a.text.slice(0, 30)));

    // Errors as the client's API errors.
    await expectError(400, () => client.chat.completions.create({ model, messages: msgs, foo_bar: 1 }),
                      "unknown field", "foo_bar");
    await expectError(400, () => client.chat.completions.create({ model, messages: msgs, n: 2 }), "n=2", "n");
    await expectError(400, () => client.chat.completions.create({ model, messages: msgs, temperature: 3 }),
                      "temperature range", "temperature");
    await expectError(400, () => client.chat.completions.create({ model, messages: [{ role: "tool", content: "x" }] }),
                      "tool role", "tool");
    await expectError(400, () => client.completions.create({ model, prompt: new Array(5000).fill(65) }),
                      "prompt longer than the context", "context length");
    await expectError(404, () => client.chat.completions.create({ model: "no-such-model", messages: msgs }),
                      "unknown model", "no-such-model");
    const noKey = new OpenAI({ baseURL: args.base, apiKey: "wrong-key", maxRetries: 0 });
    await expectError(401, () => noKey.chat.completions.create({ model, messages: msgs }), "wrong key");
    await expectError(401, () => noKey.models.list(), "wrong key on models");
    console.log("all openai client checks passed");
}

main().catch((e) => { console.error("FAIL:", e); process.exit(1); });
