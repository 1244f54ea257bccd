// Reading RLIMIT_MEMLOCK from /proc (lib/memlock.ts): the soft limit, in bytes
// or unlimited, and which registration failures are explained by it.
import { describe, expect, it } from 'vitest'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { explainRegistrationFailure, memlockLimit } from '../../dist/memlock.js'
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
})
