// Host-only tests: no RDMA device needed.
import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    include: ['test/unit/**/*.test.ts'],
    pool: 'forks', // native addons crash the threads pool
    testTimeout: 20_000,
  },
})
