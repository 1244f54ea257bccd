// RDMA suites: need a real device (run them through scripts/test.mjs, which
// provides one with scripts/softroce.sh). One forked process for all files:
// Node starts slowly in the emulated guest.
import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    include: ['test/rdma/**/*.test.ts'],
    pool: 'forks',
    poolOptions: { forks: { singleFork: true, execArgv: ['--expose-gc'] } },
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
})
