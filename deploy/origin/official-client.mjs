#!/usr/bin/env node
// Thin CLI around the OFFICIAL Durable Streams TypeScript client
// (@durable-streams/client, pinned in package.json). edge's tests use it to
// prove that a real client works through the edge.
//
//   node official-client.mjs read --url URL --live sse|long-poll
//                                 [--offset -1] [--timeout-ms 60000]
//     Reads a JSON stream with stream({live}) + jsonStream() until the
//     client ends the session by itself because the stream is closed.
//     stdout: {"item": <JSON value>}            one line per item, in order
//             {"done": true, "items": N, "closed": true|false}
//     exit 0 iff the session ended on stream closure; otherwise prints
//     {"error": "..."} and exits 1 (timeout, HTTP/protocol error, or the
//     session ending without closure). A 404 on the first request is retried
//     until the timeout, so a reader may start just before the stream exists.
//
//   node official-client.mjs produce --url URL --count N
//                                 [--rate-per-second 50] [--producer-id p1]
//     Creates the stream (PUT, application/json; an existing open stream with
//     the same config is fine), appends N items {"seq": i, "text": "token-i"}
//     (i = 0..N-1) through IdempotentProducer (Producer-Id / Producer-Epoch 0
//     / Producer-Seq), at about the given rate (0 = as fast as possible),
//     then producer.close() (flush + POST with Stream-Closed: true,
//     idempotent).
//     stdout: {"produced": N}   exit 0;   on error {"error": "..."}  exit 1.
//
// stdout carries only JSON lines; diagnostics go to stderr.
import { Console } from "node:console";
import { setMaxListeners } from "node:events";
import { parseArgs } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";
import { DurableStream, IdempotentProducer, stream } from "@durable-streams/client";

// The client warns via console.warn (e.g. SSE -> long-poll fallback); keep all
// console output off stdout.
const errConsole = new Console({ stdout: process.stderr, stderr: process.stderr });
for (const k of ["log", "info", "debug", "warn", "error"]) console[k] = errConsole[k].bind(errConsole);

const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

function finish(code, obj) {
  // Exit explicitly (idle keep-alive sockets could otherwise linger), but only
  // once the last line has been handed to the OS.
  process.stdout.write(JSON.stringify(obj) + "\n", () => process.exit(code));
}

function describe(err) {
  const status = err?.status !== undefined ? ` (status ${err.status})` : "";
  return `${err?.name ?? "Error"}: ${err?.message ?? String(err)}${status}`;
}

function intOpt(opts, name, min) {
  const n = Number(opts[name]);
  if (!Number.isInteger(n) || n < min) {
    console.error(`official-client.mjs: --${name} must be an integer >= ${min}, got ${opts[name]}`);
    process.exit(2);
  }
  return n;
}

async function read(opts) {
  if (opts.live !== "sse" && opts.live !== "long-poll") {
    console.error(`official-client.mjs: --live must be sse or long-poll, got ${opts.live}`);
    process.exit(2);
  }
  const timeoutMs = intOpt(opts, "timeout-ms", 1);
  const deadline = Date.now() + timeoutMs;
  const abort = new AbortController();
  let timedOut = false;
  const timer = setTimeout(() => { timedOut = true; abort.abort(new Error("timeout")); }, timeoutMs);

  setMaxListeners(0, abort.signal); // each stream() attempt adds a listener
  let items = 0;
  let closed = false;
  try {
    // The first request is a plain catch-up GET (no live param); the client
    // switches to ?live=<mode> once it is up to date.
    let res;
    for (;;) {
      try {
        res = await stream({ url: opts.url, offset: opts.offset, live: opts.live, signal: abort.signal });
        break;
      } catch (err) {
        if (err?.status !== 404 || timedOut || Date.now() + 100 >= deadline) throw err;
        console.error("official-client.mjs: stream not found yet, retrying");
        await sleep(100);
      }
    }
    // jsonStream() flattens batches into items and ends when the client ends
    // the session by itself: on closure it stops reconnecting/long-polling
    // (or on our abort). Errors are thrown here.
    for await (const item of res.jsonStream()) { out({ item }); items += 1; }
    closed = res.streamClosed;
  } catch (err) {
    clearTimeout(timer);
    return finish(1, { error: timedOut ? `timeout after ${timeoutMs} ms (${items} items)` : describe(err) });
  }
  clearTimeout(timer);
  if (timedOut) return finish(1, { error: `timeout after ${timeoutMs} ms (${items} items)` });
  out({ done: true, items, closed });
  if (!closed) return finish(1, { error: "session ended without stream closure" });
  process.exit(0);
}

async function produce(opts) {
  const count = intOpt(opts, "count", 0);
  const rate = intOpt(opts, "rate-per-second", 0);
  const errors = [];
  try {
    // contentType on the handle matters: IdempotentProducer sends the
    // handle's contentType and only wraps items in a JSON array when it is
    // application/json.
    const handle = new DurableStream({ url: opts.url, contentType: "application/json" });
    // Create-only PUT; the protocol makes it idempotent for a matching
    // config (200), and a conflicting one (409) is an error.
    await handle.create();
    const producer = new IdempotentProducer(handle, opts["producer-id"], {
      epoch: 0,
      onError: (err) => errors.push(err),
    });
    for (let i = 0; i < count; i++) {
      producer.append(JSON.stringify({ seq: i, text: `token-${i}` })); // fire-and-forget
      if (rate > 0 && i < count - 1) await sleep(1000 / rate);
      if (errors.length) throw errors[0];
    }
    await producer.flush();
    if (errors.length) throw errors[0];
    await producer.close(); // flushes, then POST with Stream-Closed: true
    if (errors.length) throw errors[0];
  } catch (err) {
    return finish(1, { error: describe(err) });
  }
  finish(0, { produced: count });
}

const [command, ...rest] = process.argv.slice(2);
const options = {
  read: {
    url: { type: "string" },
    live: { type: "string" },
    offset: { type: "string", default: "-1" },
    "timeout-ms": { type: "string", default: "60000" },
  },
  produce: {
    url: { type: "string" },
    count: { type: "string" },
    "rate-per-second": { type: "string", default: "50" },
    "producer-id": { type: "string", default: "p1" },
  },
}[command];
if (!options) {
  console.error("usage: official-client.mjs read|produce --url URL ... (see header comment)");
  process.exit(2);
}
const { values: opts } = parseArgs({ args: rest, options });
if (!opts.url || (command === "produce" && opts.count === undefined)) {
  console.error(`official-client.mjs ${command}: missing --url${command === "produce" ? " or --count" : ""}`);
  process.exit(2);
}
await (command === "read" ? read(opts) : produce(opts));
