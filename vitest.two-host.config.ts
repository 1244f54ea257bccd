// The two-host suite: the same files run on both guests of
// `scripts/softroce.sh run --topology two-host`; each test branches on
// SOFTROCE_HOST_INDEX (0 serves, 1 connects to SOFTROCE_PEER_ADDR).
import { defineConfig } from 'vitest/config'
import { BaseSequencer, type TestSpecification } from 'vitest/node'

// Both guests must run the files in the same order (each file is a
// rendezvous of the two sides): by file name, never by the duration cache,
// which differs between the guests.
class ByName extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    return [...files].sort((a, b) => a.moduleId.localeCompare(b.moduleId, 'en', { numeric: true }))
  }
  override async shard(files: TestSpecification[]): Promise<TestSpecification[]> {
    return files
  }
}

// `npm test` runs every file: 10, the transfer engine's 256 MiB (20), the
// faults that fit in CI time (30: 1% and 5% loss, a link flap, a kill -9)
// the lock table (40), the KV-cache example across the hosts (50), two rails (60), two rails found
// by name (61), the kv-cluster example across the hosts (62) and two rails of unequal speed (63).
// NODE_IBVERBS_TWO_HOST=all (`npm run test:two-host:all`) is kept for files still being
// proven there.
const all = process.env.NODE_IBVERBS_TWO_HOST === 'all'

export default defineConfig({
  test: {
    include: all ? ['test/two-host/**/*.test.ts'] : ['10', '20', '30', '40', '50', '60', '61', '62', '63'].map((n) => `test/two-host/${n}.*.test.ts`),
    pool: 'forks',
    poolOptions: { forks: { singleFork: true } },
    sequence: { sequencer: ByName },
    testTimeout: 180_000,
    hookTimeout: 180_000,
  },
})
