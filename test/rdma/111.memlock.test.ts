// Registered memory is locked memory: under a small RLIMIT_MEMLOCK (and
// without CAP_IPC_LOCK, which root has and which lifts the limit) a
// registration past the limit fails with ERR_MEMLOCK_LIMIT, a message that
// names RLIMIT_MEMLOCK and the fix; what fits still works.
import { describe, expect, it } from 'vitest'
import { execFile } from 'node:child_process'
import { fileURLToPath } from 'node:url'

const child = fileURLToPath(new URL('./fixtures/memlock-child.mjs', import.meta.url))
const LIMIT = 65536 // 64 KiB, what `ulimit -l 64` gives

/** The child under `prlimit --memlock`, optionally without CAP_IPC_LOCK (setpriv drops it before exec). */
function runChild(dropIpcLock: boolean): Promise<Record<string, any>> {
  const drop = dropIpcLock ? ['setpriv', '--inh-caps=-ipc_lock', '--bounding-set=-ipc_lock'] : []
  const argv = [...drop, 'prlimit', `--memlock=${LIMIT}:${LIMIT}`, process.execPath, child, String(1 << 20)]
  return new Promise((resolve, reject) => {
    execFile(argv[0], argv.slice(1), { timeout: 240_000, encoding: 'utf8' }, (error, stdout, stderr) => {
      if (error) return reject(new Error(`${argv.join(' ')} failed: ${error.message}\n${stderr}`))
      try { resolve(JSON.parse(stdout.trim().split('\n').pop()!)) } catch { reject(new Error(`no result line: ${stdout}\n${stderr}`)) }
    })
  })
}

describe('RLIMIT_MEMLOCK of 64 KiB', () => {
  it('without CAP_IPC_LOCK: 1 MiB registrations fail with ERR_MEMLOCK_LIMIT naming the limit and the fix; 8 KiB works', async () => {
    const result = await runChild(true)
    expect(result.copied).toBe(true) // a region under the limit moves verified bytes
    for (const failure of [result.allocRegion, result.registerMemory]) {
      expect(failure).toMatchObject({ name: 'RdmaError', code: 'ERR_MEMLOCK_LIMIT', errno: 12, syscall: 'ibv_reg_mr' })
      expect(failure.message).toContain(`RLIMIT_MEMLOCK is ${LIMIT} bytes`)
      expect(failure.message).toContain('ulimit -l unlimited')
      expect(failure.message).toContain('CAP_IPC_LOCK')
    }
    expect(result.stillWorks).toBeNull() // a refusal leaves the PD usable
  }, 300_000)

  it('with CAP_IPC_LOCK (root) the limit does not apply: the same registrations succeed', async () => {
    const result = await runChild(false)
    expect(result).toMatchObject({ copied: true, allocRegion: null, registerMemory: null, stillWorks: null })
  }, 300_000)
})
