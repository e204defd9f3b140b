#!/usr/bin/env node
// Launcher for the reference Durable Streams origin (DurableStreamTestServer),
// with a side port that reports how many requests reached the origin. edge's
// tests use those counts to prove what the cache did and did not forward.
//
//   node origin.mjs [--port N] [--host H] [--long-poll-timeout-ms N]
//                   [--data-dir DIR] [--stats-port N]
//
// Prints exactly one JSON line on stdout once both ports listen:
//   {"url":"http://127.0.0.1:PORT","stats":"http://127.0.0.1:STATSPORT","pid":PID}
// Stats port: GET /counts[?path=/stream] (the path filters requests, total, open and
// peak_open_live to that stream) and POST /reset (204). `credentials` lists, per method,
// the distinct Authorization and Cookie values (and any `token` query parameter) that
// reached the origin, so tests can prove whose credentials travel upstream.
import { createServer } from "node:http";
import { Console } from "node:console";
import { parseArgs } from "node:util";
import { DurableStreamTestServer } from "@durable-streams/server";

// The server logs with console.info (e.g. FileBackedStreamStore recovery),
// which would land on stdout. stdout is reserved for the single JSON line
// that callers parse, so send all console output to stderr.
const errConsole = new Console({ stdout: process.stderr, stderr: process.stderr });
for (const k of ["log", "info", "debug", "warn", "error"]) console[k] = errConsole[k].bind(errConsole);

const { values: opts } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    host: { type: "string", default: "127.0.0.1" },
    "long-poll-timeout-ms": { type: "string", default: "30000" },
    "data-dir": { type: "string" },
    "stats-port": { type: "string", default: "0" },
  },
});

function intOpt(name) {
  const n = Number(opts[name]);
  if (!Number.isInteger(n) || n < 0) {
    console.error(`origin.mjs: --${name} must be a non-negative integer, got ${opts[name]}`);
    process.exit(2);
  }
  return n;
}

const host = opts.host;
const server = new DurableStreamTestServer({
  port: intOpt("port"),
  host,
  longPollTimeout: intOpt("long-poll-timeout-ms"),
  dataDir: opts["data-dir"], // undefined => in-memory store
});

// ---- request accounting -------------------------------------------------

let total = 0;
const counts = new Map(); // JSON.stringify([method, path, offset, live]) -> count
const open = { sse: 0, "long-poll": 0, catchup: 0, other: 0 };
let peakOpenLive = 0;
// The same, per stream path, so a test can look at its own stream while others run.
const openByPath = new Map(); // path -> { sse, long-poll, catchup, other }
const peakByPath = new Map(); // path -> peak open live (sse + long-poll)
const credentialsByPath = new Map(); // path -> Set of "METHOD name: value"

function kindOf(method, live) {
  if (live === "sse" || live === "long-poll") return live;
  return method === "GET" && live === null ? "catchup" : "other";
}

// Wrap the instance method before start(): the http.createServer callback
// calls this.handleRequest(req, res), so every request passes through here,
// including ones answered by injected faults or OPTIONS.
const handle = server.handleRequest.bind(server);
server.handleRequest = (req, res) => {
  // Same URL parsing as the server, so `path` matches what it routes on.
  const url = new URL(req.url ?? "/", "http://origin");
  const method = (req.method ?? "GET").toUpperCase();
  const offset = url.searchParams.get("offset");
  const live = url.searchParams.get("live");

  total += 1;
  const seen = credentialsByPath.get(url.pathname) ?? new Set();
  credentialsByPath.set(url.pathname, seen);
  for (const name of ["authorization", "cookie"]) {
    if (req.headers[name] !== undefined) seen.add(`${method} ${name}: ${req.headers[name]}`);
  }
  for (const value of url.searchParams.getAll("token")) seen.add(`${method} token=${value}`);
  const key = JSON.stringify([method, url.pathname, offset, live]);
  counts.set(key, (counts.get(key) ?? 0) + 1);

  // 'close' fires once per response, whether it ended normally or the client
  // went away, so open counts cannot drift.
  const kind = kindOf(method, live);
  open[kind] += 1;
  peakOpenLive = Math.max(peakOpenLive, open.sse + open["long-poll"]);
  const mine = openByPath.get(url.pathname) ?? { sse: 0, "long-poll": 0, catchup: 0, other: 0 };
  openByPath.set(url.pathname, mine);
  mine[kind] += 1;
  peakByPath.set(
    url.pathname,
    Math.max(peakByPath.get(url.pathname) ?? 0, mine.sse + mine["long-poll"]),
  );
  res.once("close", () => {
    open[kind] -= 1;
    mine[kind] -= 1;
  });

  return handle(req, res);
};

function snapshot(pathFilter) {
  const requests = [];
  const credentials = new Set();
  for (const [path, values] of credentialsByPath) {
    if (pathFilter !== null && path !== pathFilter) continue;
    for (const value of values) credentials.add(value);
  }
  let filteredTotal = 0;
  for (const [key, count] of counts) {
    const [method, path, offset, live] = JSON.parse(key);
    if (pathFilter !== null && path !== pathFilter) continue;
    requests.push({ method, path, offset, live, count });
    filteredTotal += count;
  }
  return {
    // Unfiltered total is the monotonic counter (since last reset).
    total: pathFilter === null ? total : filteredTotal,
    requests,
    open: pathFilter === null
      ? { ...open }
      : { ...(openByPath.get(pathFilter) ?? { sse: 0, "long-poll": 0, catchup: 0, other: 0 }) },
    peak_open_live: pathFilter === null ? peakOpenLive : (peakByPath.get(pathFilter) ?? 0),
    credentials: [...credentials].sort(),
  };
}

const stats = createServer((req, res) => {
  const url = new URL(req.url ?? "/", "http://stats");
  if (req.method === "GET" && url.pathname === "/counts") {
    const body = JSON.stringify(snapshot(url.searchParams.get("path")));
    res.writeHead(200, { "content-type": "application/json", "cache-control": "no-store" });
    res.end(body);
  } else if (req.method === "POST" && url.pathname === "/reset") {
    // Open connections are real state, not history: keep them.
    total = 0;
    counts.clear();
    peakOpenLive = 0;
    peakByPath.clear();
    credentialsByPath.clear();
    res.writeHead(204);
    res.end();
  } else {
    res.writeHead(404, { "content-type": "text/plain" });
    res.end("not found\n");
  }
});

// ---- lifecycle ----------------------------------------------------------

let stopping = false;
async function shutdown(signal) {
  if (stopping) return;
  stopping = true;
  // server.stop() waits for http.Server.close(), which waits for every open
  // connection; a lingering SSE/keep-alive client could hold it forever.
  setTimeout(() => {
    console.error(`origin.mjs: stop() still pending after 3s (${signal}); exiting`);
    process.exit(0);
  }, 3000).unref();
  try {
    await server.stop(); // also closes the lmdb store, so data is flushed
    stats.close();
    stats.closeAllConnections();
  } catch (err) {
    console.error("origin.mjs: error during stop:", err);
  }
  process.exit(0);
}
process.on("SIGTERM", () => shutdown("SIGTERM"));
process.on("SIGINT", () => shutdown("SIGINT"));

const url = await server.start();
await new Promise((resolve, reject) => {
  stats.once("error", reject);
  stats.listen(intOpt("stats-port"), host, resolve);
});
const statsUrl = `http://${host}:${stats.address().port}`;
// Node writes to pipes and files synchronously on Linux, so this line is
// out before anyone can see the ports in use.
process.stdout.write(JSON.stringify({ url, stats: statsUrl, pid: process.pid }) + "\n");
