import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["conformance/**/*.test.mjs"],
    // Tests talk to a real server (possibly through edge); vitest's 5 s
    // default is tight for that. Long-poll tests set their own timeout.
    testTimeout: 20000,
    hookTimeout: 20000,
    // One file, one worker: the suite is sequential anyway.
    fileParallelism: false,
    passWithNoTests: false,
  },
});
