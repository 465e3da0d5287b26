// sse_client.js — one streamed /v1/completions request, timed on arrival.
//
//   node sse_client.js URL BODY_JSON
//
// Prints "chunks N first_ms F last_ms L tokens T": text chunks received,
// arrival of the first and the last text chunk (ms since the request was
// sent), and usage.completion_tokens from the include_usage chunk.  Plain
// fetch, not the openai client, so that client-side parsing adds as little
// as possible to what is measured.
"use strict";
const [url, body] = process.argv.slice(2);

async function main() {
    const t0 = performance.now();
    const r = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body });
    if (r.status !== 200) throw new Error(`status ${r.status}: ${await r.text()}`);
    const dec = new TextDecoder();
    let buf = "", chunks = 0, first = 0, last = 0, tokens = -1;
    for await (const part of r.body) {
        const now = performance.now() - t0;
        buf += dec.decode(part, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
            const ev = buf.slice(0, i);
            buf = buf.slice(i + 2);
            if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
            const j = JSON.parse(ev.slice(6));
            if (j.usage) tokens = j.usage.completion_tokens;
            if (j.choices && j.choices.length && j.choices[0].text) {
                chunks++;
                if (!first) first = now;
                last = now;
            }
        }
    }
    console.log(`chunks ${chunks} first_ms ${first.toFixed(3)} last_ms ${last.toFixed(3)} tokens ${tokens}`);
}
main().catch((e) => { console.error("sse_client:", e.message); process.exit(1); });
