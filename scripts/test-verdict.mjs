// The verdict of `npm test` (scripts/test.mjs) from what each suite printed
// and its exit code; pure, so test/unit/60 can check it.

export const ENV_UNAVAILABLE = 201

// vitest's summary line, e.g. "Tests  2 failed | 40 passed | 1 skipped (43)";
// `found` says whether there was one. Todo tests count as skipped.
export function counts(text) {
  const line = text.replace(/\x1b\[[0-9;]*m/g, '').split('\n').filter((l) => /^\s*Tests\s/.test(l)).pop()
  const n = (word) => Number(line?.match(new RegExp(`(\\d+) ${word}`))?.[1] ?? 0)
  return { found: line !== undefined, passed: n('passed'), failed: n('failed'), skipped: n('skipped') + n('todo') }
}

const sum = (a, b) => ({ found: a.found && b.found, passed: a.passed + b.passed, failed: a.failed + b.failed, skipped: a.skipped + b.skipped })
const show = (c) => `${c.passed} passed, ${c.failed} failed, ${c.skipped} skipped`

// The lines one guest of the two-host topology printed, without their "[hostN] " tag.
function hostLines(text, index) {
  const tag = `[host${index}] `
  return text.split('\n').filter((l) => l.startsWith(tag)).map((l) => l.slice(tag.length)).join('\n')
}

/**
 * unit, rdma, twoHost: {code, text} of each run. Returns {failed, messages, summary}:
 * under requireRdma an RDMA suite that could not run or skipped a test fails;
 * in the two-host suite both guests' summaries count, and each must have run
 * tests without failure.
 */
export function verdict({ unit, rdma, twoHost, requireRdma }) {
  const messages = []
  const fail = (message) => { failed = true; messages.push(message) }
  let failed = unit.code !== 0
  const unitCounts = counts(unit.text)
  const rdmaCounts = counts(rdma.text)
  const hostCounts = [0, 1].map((index) => counts(hostLines(twoHost.text, index)))
  const twoHostCounts = sum(hostCounts[0], hostCounts[1])

  if (rdma.code === ENV_UNAVAILABLE && !requireRdma) {
    messages.push('!'.repeat(72), '!! RDMA suites SKIPPED: no RDMA device could be provided (see above).',
      '!! They are NOT counted as passed. Fix: sudo bash scripts/softroce.sh provision', '!'.repeat(72))
  } else if (rdma.code !== 0) {
    fail(`RDMA suites failed (exit ${rdma.code}${rdma.code >= 201 && rdma.code <= 204 ? ': the Soft-RoCE environment could not run them' : ''})`)
  } else if (rdmaCounts.passed === 0) {
    fail('RDMA suites ran no test: that is a failure')
  } else if (requireRdma && rdmaCounts.skipped > 0) {
    fail(`RDMA suites skipped ${rdmaCounts.skipped} test(s) under CI / NODE_IBVERBS_REQUIRE_RDMA=1: that is a failure`)
  }

  if (twoHost.code === ENV_UNAVAILABLE && !requireRdma) {
    messages.push('!! two-host suite SKIPPED (no QEMU environment); NOT counted as passed')
  } else if (twoHost.code !== 0) {
    fail(`two-host suite failed (exit ${twoHost.code})`)
  } else {
    hostCounts.forEach((c, index) => {
      if (!c.found || c.passed === 0) fail(`two-host suite: host ${index} ran no test: that is a failure`)
      else if (c.failed > 0) fail(`two-host suite: host ${index} had ${c.failed} failed test(s)`)
      else if (requireRdma && c.skipped > 0) fail(`two-host suite: host ${index} skipped ${c.skipped} test(s) under CI / NODE_IBVERBS_REQUIRE_RDMA=1: that is a failure`)
    })
  }

  const total = sum(sum(unitCounts, rdmaCounts), twoHostCounts)
  const failedCount = total.failed + (failed && total.failed === 0 ? 1 : 0)
  const summary = [
    `unit: ${show(unitCounts)}; rdma: ${show(rdmaCounts)}; two-host: ${show(twoHostCounts)} (host 0: ${show(hostCounts[0])}; host 1: ${show(hostCounts[1])})`,
    `${total.passed} passed, ${failedCount} failed, ${total.skipped} skipped`,
  ]
  return { failed, messages, summary }
}
