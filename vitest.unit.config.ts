// Host-only tests: no RDMA device needed.
import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    // The addon's test-only entry points (native/test_hooks.cc) are registered only with this.
    env: { NODE_IBVERBS_TEST_HOOKS: '1' },
    include: ['test/unit/**/*.test.ts'],
    pool: 'forks', // native addons crash the threads pool
    testTimeout: 20_000,
  },
})
