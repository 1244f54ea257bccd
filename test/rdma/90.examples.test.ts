// The example programs keep working: each runs to its own verification.
import { describe, expect, it } from 'vitest'
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'

const example = (name: string) => fileURLToPath(new URL(`../../examples/${name}`, import.meta.url))

describe('examples', () => {
  it.each([
    ['two-queue-pairs.mjs', [], /done: every byte verified/],
    ['kv-cache-transfer.mjs', ['--blocks', '16', '--requests', '2'], /decode side verified 32 blocks \(2\.0 MiB, push\)/],
    ['kv-cache-transfer.mjs', ['--blocks', '16', '--requests', '2', '--mode', 'pull'], /decode side verified 32 blocks \(2\.0 MiB, pull\)/],
    ['transfer-metrics.mjs', ['--transfers', '4'], /rdma_transfer_bytes_total\{agent="prefill",peer="decode"\} 4194304/],
  ] as const)('%s runs and verifies its data', (name, args, success) => {
    const run = spawnSync(process.execPath, [example(name), ...args], { encoding: 'utf8', timeout: 120_000 })
    expect(run.stderr).toBe('')
    expect(run.status).toBe(0)
    expect(run.stdout).toMatch(success)
  })
})
