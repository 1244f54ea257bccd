// The two-host suite: the same files run on both guests of
// `scripts/softroce.sh run --topology two-host`; each test branches on
// SOFTROCE_HOST_INDEX (0 serves, 1 connects to SOFTROCE_PEER_ADDR).
import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    include: ['test/two-host/**/*.test.ts'],
    pool: 'forks',
    poolOptions: { forks: { singleFork: true } },
    testTimeout: 180_000,
    hookTimeout: 180_000,
  },
})
