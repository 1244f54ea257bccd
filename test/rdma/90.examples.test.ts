// The example programs keep working: each runs to its own verification.
import { describe, expect, it } from 'vitest'
import { execFile } from 'node:child_process'
import { fileURLToPath } from 'node:url'

const example = (name: string) => fileURLToPath(new URL(`../../examples/${name}`, import.meta.url))

/**
 * Runs an example without blocking this worker's event loop (spawnSync did:
 * an example of more than 60 s under the sanitizer build made vitest's worker
 * time out reporting to its parent, and failed the run).
 */
function runExample(name: string, args: readonly string[]): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [example(name), ...args], { encoding: 'utf8', timeout: 120_000, maxBuffer: 16 << 20 }, (error, stdout, stderr) => {
      const status = error ? (typeof error.code === 'number' ? error.code : null) : 0
      resolve({ status, stdout, stderr })
    })
  })
}

describe('examples', () => {
  it.each([
    ['two-queue-pairs.mjs', [], /done: every byte verified/],
    ['kv-cache-transfer.mjs', ['--blocks', '16', '--requests', '2'], /decode side verified 32 blocks \(2\.0 MiB, push\)/],
    ['kv-cache-transfer.mjs', ['--blocks', '16', '--requests', '2', '--mode', 'pull'], /decode side verified 32 blocks \(2\.0 MiB, pull\)/],
    ['transfer-metrics.mjs', ['--transfers', '4'], /rdma_transfer_bytes_total\{agent="prefill",peer="decode"\} 4194304/],
  ] as const)('%s runs and verifies its data', async (name, args, success) => {
    const run = await runExample(name, args)
    expect(run.stderr).toBe('')
    expect(run.status).toBe(0)
    expect(run.stdout).toMatch(success)
  }, 150_000)
})
