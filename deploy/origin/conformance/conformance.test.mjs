// The package's own CLI cannot find its test file when installed under
// node_modules, so this file hands the suite to vitest directly.
import { runConformanceTests } from "@durable-streams/server-conformance-tests";

const baseUrl = process.env.CONFORMANCE_BASE_URL;
if (!baseUrl) {
  throw new Error(
    "CONFORMANCE_BASE_URL is not set: run e.g. CONFORMANCE_BASE_URL=http://127.0.0.1:PORT npx vitest run",
  );
}

// Optional: the suite only uses this to size the per-test timeout of its
// long-poll tests (value + 1 s; the suite's default is 20000).
const longPoll = process.env.CONFORMANCE_LONG_POLL_TIMEOUT_MS;
runConformanceTests({
  baseUrl,
  ...(longPoll ? { longPollTimeoutMs: Number(longPoll) } : {}),
});
