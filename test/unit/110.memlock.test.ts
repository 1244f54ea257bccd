// Reading RLIMIT_MEMLOCK from /proc (lib/core/memlock.ts): the soft limit, in bytes
// or unlimited, and which registration failures are explained by it.
import { describe, expect, it } from 'vitest'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { explainRegistrationFailure, memlockLimit } from '../../dist/core/memlock.js'
import { RdmaError } from '../../dist/index.js'

const dir = mkdtempSync(join(tmpdir(), 'memlock-'))
function limits(line: string): string {
  const file = join(dir, String(Math.random()))
  writeFileSync(file, `Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 4096                 files\n${line}\n`)
  return file
}

describe('memlockLimit', () => {
  it('reads the soft limit in bytes', () => {
    expect(memlockLimit(limits('Max locked memory         65536                8388608              bytes'))).toBe(65536)
  })
  it('reads unlimited as Infinity', () => {
    expect(memlockLimit(limits('Max locked memory         unlimited            unlimited            bytes'))).toBe(Infinity)
  })
  it('is undefined where the file says nothing', () => {
    expect(memlockLimit(join(dir, 'missing'))).toBeUndefined()
    expect(memlockLimit(limits('Max processes 10 10 processes'))).toBeUndefined()
  })
})

describe('explainRegistrationFailure', () => {
  it('leaves other errors alone', () => {
    const einval = new RdmaError('ibv_reg_mr: Invalid argument', { code: 'EINVAL', errno: 22, syscall: 'ibv_reg_mr' })
    expect(explainRegistrationFailure(einval, 4096)).toBe(einval)
    const otherCall = new RdmaError('mmap: Cannot allocate memory', { code: 'ENOMEM', errno: 12, syscall: 'mmap' })
    expect(explainRegistrationFailure(otherCall, 4096)).toBe(otherCall)
  })

  // The process these tests run in may hold CAP_IPC_LOCK (root): the /proc files are given.
  const enomem = () => new RdmaError('ibv_reg_mr: Cannot allocate memory', { code: 'ENOMEM', errno: 12, syscall: 'ibv_reg_mr' })
  const status = (capEff: string) => {
    const file = join(dir, String(Math.random()))
    writeFileSync(file, `Name:\tnode\nVmPin:\t      64 kB\nCapEff:\t${capEff}\n`)
    return file
  }
  const finite = () => limits('Max locked memory         65536                65536                bytes')

  it('names RLIMIT_MEMLOCK and the fix when a finite limit refused the pin and CAP_IPC_LOCK is missing', () => {
    const cause = enomem()
    const error = explainRegistrationFailure(cause, 1 << 20, { limits: finite(), status: status('0000000000000000') }) as RdmaError
    expect(error).toBeInstanceOf(RdmaError)
    expect(error).toMatchObject({ code: 'ERR_MEMLOCK_LIMIT', errno: 12, syscall: 'ibv_reg_mr', cause })
    expect(error.message).toMatch(/cannot pin 1048576 bytes: RLIMIT_MEMLOCK is 65536 bytes \(65536 bytes are pinned already\)/)
    expect(error.message).toMatch(/ulimit -l unlimited/)
    expect(error.message).toMatch(/CAP_IPC_LOCK/)
  })

  it('leaves ENOMEM alone when the limit is unlimited or the process holds CAP_IPC_LOCK', () => {
    const unlimited = limits('Max locked memory         unlimited            unlimited            bytes')
    const a = enomem()
    expect(explainRegistrationFailure(a, 4096, { limits: unlimited, status: status('0000000000000000') })).toBe(a)
    const b = enomem()
    expect(explainRegistrationFailure(b, 4096, { limits: finite(), status: status('0000000000004000') })).toBe(b) // bit 14
  })
})
