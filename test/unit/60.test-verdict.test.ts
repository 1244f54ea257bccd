// scripts/test.mjs's verdict: what counts as a pass of `npm test`.
import { describe, expect, it } from 'vitest'
// @ts-expect-error: plain JavaScript module without types
import { counts, verdict } from '../../scripts/test-verdict.mjs'

const summary = (passed: number, failed = 0, skipped = 0) =>
  ` Test Files  1 passed (1)\n      Tests  ${failed ? `${failed} failed | ` : ''}${passed} passed${skipped ? ` | ${skipped} skipped` : ''} (${passed + failed + skipped})\n`
const tagged = (host: number, text: string) => text.split('\n').map((l) => `[host${host}] ${l}`).join('\n')
const ok = (text: string) => ({ code: 0, text })
const unit = ok(summary(150))
const rdma = ok(summary(100))
const twoHost = ok(tagged(0, summary(2)) + '\n' + tagged(1, summary(2)))

describe('scripts/test-verdict.mjs', () => {
  it('reads passed, failed, skipped and todo from vitest\'s summary line', () => {
    expect(counts('\x1b[2m      Tests \x1b[22m 2 failed | 40 passed | 1 skipped | 3 todo (46)')).toEqual({ found: true, passed: 40, failed: 2, skipped: 4 })
    expect(counts('no summary here')).toEqual({ found: false, passed: 0, failed: 0, skipped: 0 })
  })

  it('passes when every suite ran and passed, and prints skipped counts', () => {
    const result = verdict({ unit, rdma, twoHost, requireRdma: true })
    expect(result.failed).toBe(false)
    expect(result.summary).toEqual([
      'unit: 150 passed, 0 failed, 0 skipped; rdma: 100 passed, 0 failed, 0 skipped; two-host: 4 passed, 0 failed, 0 skipped (host 0: 2 passed, 0 failed, 0 skipped; host 1: 2 passed, 0 failed, 0 skipped)',
      '254 passed, 0 failed, 0 skipped',
    ])
  })

  it('fails when an RDMA test was skipped under CI / NODE_IBVERBS_REQUIRE_RDMA=1, not otherwise', () => {
    const skipping = ok(summary(99, 0, 1))
    const strict = verdict({ unit, rdma: skipping, twoHost, requireRdma: true })
    expect(strict.failed).toBe(true)
    expect(strict.messages).toContain('RDMA suites skipped 1 test(s) under CI / NODE_IBVERBS_REQUIRE_RDMA=1: that is a failure')
    expect(strict.summary[1]).toBe('253 passed, 1 failed, 1 skipped')
    expect(verdict({ unit, rdma: skipping, twoHost, requireRdma: false }).failed).toBe(false)
    const hostSkipping = ok(tagged(0, summary(1, 0, 1)) + '\n' + tagged(1, summary(2)))
    expect(verdict({ unit, rdma, twoHost: hostSkipping, requireRdma: true }).failed).toBe(true)
  })

  it('fails when no RDMA device could be provided under CI, and only warns otherwise', () => {
    const unavailable = { code: 201, text: '' }
    expect(verdict({ unit, rdma: unavailable, twoHost: unavailable, requireRdma: true }).failed).toBe(true)
    expect(verdict({ unit, rdma: unavailable, twoHost: unavailable, requireRdma: false }).failed).toBe(false)
  })

  it('counts both guests of the two-host suite: a failure or a missing summary on host 0 fails', () => {
    const host0Failed = ok(tagged(0, summary(1, 1)) + '\n' + tagged(1, summary(2)))
    const result = verdict({ unit, rdma, twoHost: host0Failed, requireRdma: true })
    expect(result.failed).toBe(true)
    expect(result.messages).toContain('two-host suite: host 0 had 1 failed test(s)')
    expect(result.summary[1]).toBe('253 passed, 1 failed, 0 skipped')
    const host0Silent = ok(tagged(1, summary(2)))
    expect(verdict({ unit, rdma, twoHost: host0Silent, requireRdma: true }).messages).toContain('two-host suite: host 0 ran no test: that is a failure')
    expect(verdict({ unit, rdma, twoHost: { code: 1, text: twoHost.text }, requireRdma: true }).failed).toBe(true)
  })
})
