// `npm run test:faults` (scripts/faults.mjs): the whole two-host fault campaign,
// run by both guests of `scripts/softroce.sh run --topology two-host`.
import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    include: ['test/two-host/31.fault-campaign.ts'],
    pool: 'forks',
    poolOptions: { forks: { singleFork: true } },
    testTimeout: 300_000,
    hookTimeout: 180_000,
  },
})
