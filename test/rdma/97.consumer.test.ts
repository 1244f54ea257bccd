// The consumer project that test/unit/78 installed from the packed tarball
// (scripts disabled, no compiler) runs here with a real device: it connects
// two queue pairs and moves bytes with WRITE, READ and SEND/RECV through the
// installed copy and its prebuilt binary, checking every byte. Under
// `npm run test:asan` (NODE_IBVERBS_SANITIZED=1) the installed copy loads the
// sanitizer build instead (NODE_IBVERBS_ADDON, which the package honours): the
// same consumer code over native code that reports any memory error.
import { expect } from 'vitest'
import { spawnSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { envMissing, needs } from './needs.js'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const consumer = join(root, 'build', 'consumer')
const script = join(consumer, 'out', 'consumer.js')
const notInstalled = existsSync(script)
  ? undefined
  : 'build/consumer is not installed (test/unit/78.consumer-install.test.ts installs it; npm test runs the unit phase first)'

needs(notInstalled ?? envMissing('SOFTROCE_DEVICE'))('the installed package moves verified bytes over RDMA', () => {
  const env = { ...process.env }
  // The installed copy must load its own prebuild; under the sanitizers, their build.
  if (process.env.NODE_IBVERBS_SANITIZED !== '1') delete env.NODE_IBVERBS_ADDON
  const out = spawnSync(process.execPath, [script, 'transfer'], { cwd: consumer, env, encoding: 'utf8', timeout: 150_000 })
  expect(out.status, `${out.stdout}\n${out.stderr}`).toBe(0)
  const result = JSON.parse(out.stdout.trim().split('\n').pop()!)
  expect(result).toEqual({ device: process.env.SOFTROCE_DEVICE, wrote: true, readBack: true, sent: true, bytes: 256 * 1024 + 38 })
}, 180_000)
