// 60 seconds of mixed operations on 16 QPs with random sizes, every byte
// checked (scripts/soak.mjs; `npm run soak` runs it for 10 minutes). Passes
// when every operation succeeded and neither RSS, open fds nor the kernel's
// QP/CQ/PD/MR counts grew over the samples taken every 15 s (RSS: 32 MiB of
// slack, plus ASan's quarantine under `npm run test:asan`).
import { describe, expect, it } from 'vitest'
import { soak } from '../../scripts/soak.mjs' // plain JS, shared with `npm run soak`

describe('soak', () => {
  it('60 s, 16 QPs, mixed operations: all verified, nothing grows', async () => {
    const result = await soak({ seconds: 60, interval: 15 })
    console.log(JSON.stringify({ ops: result.ops, bytesVerified: result.bytesVerified, first: result.samples[0], last: result.samples.at(-1) }))
    expect(result.error).toBeUndefined()
    expect(result.growth).toEqual([])
    expect(result.samples.length).toBeGreaterThanOrEqual(4)
    expect(result.ops).toBeGreaterThan(0)
    expect(result.bytesVerified).toBeGreaterThan(0)
  }, 240_000)
})
