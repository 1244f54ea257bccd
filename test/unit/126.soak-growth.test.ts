// The soak's verdict (scripts/soak.mjs growthOf): any fd or kernel object
// count that grew fails it; RSS fails it past the slack, and under ASan past
// the slack plus the allocator's quarantine (freed memory held before reuse:
// RSS that rises that much with nothing leaked; CI of stop 38 failed there).
import { describe, expect, it } from 'vitest'
import { growthOf } from '../../scripts/soak.mjs'

const sample = (seconds: number, rssMiB: number, fds = 24) => ({ at: 0, seconds, rssMiB, fds, qp: 16, cq: 16, pd: 17, mr: 32, ops: 0, bytesVerified: 0 })
// The CI run that failed: 740.7 MiB, then a plateau 46 MiB higher.
const plateau = [sample(0, 740.7), sample(15, 786.4), sample(45, 779.5), sample(60, 781.5)]
const ASAN = { LD_PRELOAD: '/usr/lib/gcc/x86_64-linux-gnu/12/libasan.so' }

describe('soak: what counts as growth', () => {
  it('RSS past the slack is growth without the sanitizer', () => {
    expect(growthOf(plateau, 32, {})).toEqual([
      'rss 740.7 -> 786.4 MiB at 15s (slack 32 MiB)',
      'rss 740.7 -> 779.5 MiB at 45s (slack 32 MiB)',
      'rss 740.7 -> 781.5 MiB at 60s (slack 32 MiB)',
    ])
  })

  it('under ASan the quarantine (256 MiB unless ASAN_OPTIONS says) is allowed too', () => {
    expect(growthOf(plateau, 32, ASAN)).toEqual([])
    expect(growthOf(plateau, 32, { ...ASAN, ASAN_OPTIONS: 'detect_leaks=0:quarantine_size_mb=8:exitcode=86' })).toEqual([
      'rss 740.7 -> 786.4 MiB at 15s (slack 40 MiB)',
      'rss 740.7 -> 781.5 MiB at 60s (slack 40 MiB)',
    ])
    expect(growthOf([sample(0, 500), sample(60, 800)], 32, ASAN)).toEqual(['rss 500 -> 800 MiB at 60s (slack 288 MiB)'])
  })

  it('an fd more is growth, under ASan too', () => {
    expect(growthOf([sample(0, 500), sample(60, 500, 25)], 32, ASAN)).toEqual(['fds 24 -> 25 at 60s'])
  })
})
