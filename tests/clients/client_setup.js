// client_setup.js — what the openai client scripts share: `--name value`
// arguments and the official client built from --base and --key.
"use strict";
const path = require("path");

function parseArgs(defaults = {}) {
    const args = { ...defaults };
    for (let i = 2; i < process.argv.length; i += 2)
        args[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
    return args;
}

const OpenAI = require(path.join(__dirname, "..", "node", "node_modules", "openai"));

function makeClient(args) {
    return new OpenAI({ baseURL: args.base, apiKey: args.key || "none", maxRetries: 0, timeout: 60000 });
}

module.exports = { parseArgs, OpenAI, makeClient };
