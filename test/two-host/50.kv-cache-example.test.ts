// The KV-cache example across two machines, as its header tells a user to run
// it: host 0 is the decode server, host 1 the prefill server; push mode (the
// prefill side WRITEs the blocks with a notification), every block checked by
// the decode side.
import { describe, expect, it } from 'vitest'
import { execFile } from 'node:child_process'
import { fileURLToPath } from 'node:url'

const role = process.env.SOFTROCE_HOST_INDEX
const local = process.env.SOFTROCE_ADDR
const peerAddr = process.env.SOFTROCE_PEER_ADDR
const PORT = 7485
const example = fileURLToPath(new URL('../../examples/kv-cache-transfer.mjs', import.meta.url))

function run(args: readonly string[]): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [example, ...args], { encoding: 'utf8', timeout: 150_000 }, (error, stdout, stderr) => {
      resolve({ status: error ? (typeof error.code === 'number' ? error.code : null) : 0, stdout, stderr })
    })
  })
}

describe(`the KV-cache example across two hosts (this is host ${role})`, () => {
  it('the decode side verifies every block the prefill side pushed', async () => {
    const common = ['--mode', 'push', '--blocks', '32', '--requests', '3', '--host', local!, '--port', String(PORT), '--timeout-ms', '120000']
    const result = role === '0'
      ? await run([...common, '--role', 'decode'])
      : await run([...common, '--role', 'prefill', '--peer', peerAddr!])
    expect(result.stderr).toBe('')
    expect(result.status).toBe(0)
    expect(result.stdout).toMatch(role === '0' ? /decode side verified 96 blocks \(6\.0 MiB, push\)/ : /prefill: 3 requests, 6\.0 MiB handed over \(push\)/)
  }, 170_000)
})
