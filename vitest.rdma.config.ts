// RDMA suites: need a real device (run them through scripts/test.mjs, which
// provides one with scripts/softroce.sh). One forked process for all files:
// Node starts slowly in the emulated guest.
import { defineConfig } from 'vitest/config'
import { BaseSequencer, type TestSpecification } from 'vitest/node'

/**
 * Vitest's order (failed first, then slowest, else largest), with the fuzz
 * file last: its hostile calls reach rxe's kernel code, and a kernel left in
 * a bad state must not fail the files after it. Seen twice in CI order
 * (95.fuzz first): rdma/35 then found 31 WRITEs posted that the kernel never
 * executed; never in 75 runs of that case without the fuzz file before it
 * (docs/reliability.md).
 */
class FuzzLast extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files)
    const fuzz = (spec: TestSpecification) => /\/95\.fuzz\.test\.ts$/.test(spec.moduleId)
    return [...sorted.filter((spec) => !fuzz(spec)), ...sorted.filter(fuzz)]
  }
}

// Exhaustion (112), worker threads (113) and fork() (114) take minutes in the
// emulated guest and have not yet passed there: `npm run test:limits` runs
// them (NODE_IBVERBS_RDMA=all) until they join `npm test` (issue 11's note).
const all = process.env.NODE_IBVERBS_RDMA === 'all'

export default defineConfig({
  test: {
    include: ['test/rdma/**/*.test.ts'],
    exclude: all ? [] : ['test/rdma/112.*.test.ts', 'test/rdma/113.*.test.ts', 'test/rdma/114.*.test.ts'],
    pool: 'forks',
    poolOptions: { forks: { singleFork: true, execArgv: ['--expose-gc'] } },
    fileParallelism: false,
    sequence: { sequencer: FuzzLast },
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
})
