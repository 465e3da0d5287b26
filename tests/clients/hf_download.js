// hf_download.js — the official `@huggingface/hub` npm client downloads
// files through a Hub mirror (tests/integration/test_mirror.sh starts it).
//
//   node hf_download.js --hub http://127.0.0.1:PORT --repo org/name [--token T] PATH...
//
// For each PATH: fileDownloadInfo (a Range 0-0 probe of the resolve that
// follows the mirror's redirect), then downloadFile as a user calls it,
// whose bytes are hashed.  Prints one JSON line per file: {"path","size","sha256",
// "etag","url"}.  With --expect-error STATUS, the first download must
// fail with that HTTP status instead (printed as {"path","status"}).
// Exits 1 on any unexpected failure.
"use strict";
const path = require("path");
const crypto = require("crypto");

const args = { paths: [] };
for (let i = 2; i < process.argv.length; i++) {
    const a = process.argv[i];
    if (a.startsWith("--")) args[a.slice(2)] = process.argv[++i];
    else args.paths.push(a);
}
const hub = require(path.join(__dirname, "..", "node", "node_modules", "@huggingface", "hub"));

async function one(p) {
    const common = { repo: args.repo, path: p, hubUrl: args.hub, accessToken: args.token };
    const info = await hub.fileDownloadInfo(common);
    if (!info) throw new Error(`${p}: not found`);
    const blob = await hub.downloadFile(common);
    const buf = Buffer.from(await blob.arrayBuffer());
    if (buf.length !== info.size)
        throw new Error(`${p}: got ${buf.length} bytes, the resolve said ${info.size}`);
    return { path: p, size: buf.length, sha256: crypto.createHash("sha256").update(buf).digest("hex"),
             etag: info.etag, url: new URL(info.url).pathname };
}

(async () => {
    if (args["expect-error"]) {
        try {
            await one(args.paths[0]);
        } catch (e) {
            const status = e.statusCode ?? e.status;
            if (String(status) !== args["expect-error"])
                throw new Error(`expected HTTP ${args["expect-error"]}, got ${status}: ${e.message}`);
            console.log(JSON.stringify({ path: args.paths[0], status }));
            return;
        }
        throw new Error(`expected HTTP ${args["expect-error"]}, the download succeeded`);
    }
    for (const p of args.paths) console.log(JSON.stringify(await one(p)));
})().catch((e) => {
    console.error(`hf_download.js: ${e.stack || e}`);
    process.exit(1);
});
