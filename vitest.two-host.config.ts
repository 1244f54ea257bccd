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

export default defineConfig({
  test: {
    include: ['test/two-host/**/*.test.ts'],
    pool: 'forks',
    poolOptions: { forks: { singleFork: true } },
    sequence: { sequencer: ByName },
    testTimeout: 180_000,
    hookTimeout: 180_000,
  },
})
