// RdmaError.code is a closed union (lib/core/error-codes.ts): every code
// literal the sources give an error, in TypeScript and in the addon, is in it.
import { describe, expect, it } from 'vitest'
import { readdirSync, readFileSync, statSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { LIBRARY_ERROR_CODES } from '../../lib/core/error-codes.js'
import { wcStatusNames } from '../../lib/core/constants.js'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')

function files(dir: string, ext: RegExp): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name)
    return statSync(path).isDirectory() ? files(path, ext) : ext.test(name) ? [path] : []
  })
}

const known = new Set<string>(LIBRARY_ERROR_CODES)
const isStatus = (code: string) => (wcStatusNames as readonly string[]).includes(code) && code !== 'SUCCESS'
const isErrno = (code: string) => /^E[A-Z0-9]+$/.test(code)
const covered = (code: string) => known.has(code) || isStatus(code) || isErrno(code)

describe('error codes', () => {
  it('every code literal in lib/ (code: \'...\') is in the union', () => {
    const found = new Set<string>()
    for (const file of files(join(root, 'lib'), /\.ts$/)) {
      for (const m of readFileSync(file, 'utf8').matchAll(/\bcode: '([A-Za-z0-9_]+)'/g)) found.add(m[1]!)
    }
    expect(found.size).toBeGreaterThan(20)
    expect([...found].filter((code) => !covered(code))).toEqual([])
  })

  it('every code the addon throws (ThrowCode(env, "...")) is in the union', () => {
    const found = new Set<string>()
    for (const file of files(join(root, 'native'), /\.(cc|h)$/)) {
      for (const m of readFileSync(file, 'utf8').matchAll(/ThrowCode\(\s*\w+,\s*"([A-Z_]+)"/g)) found.add(m[1]!)
    }
    expect(found.size).toBeGreaterThan(5)
    expect([...found].filter((code) => !covered(code))).toEqual([])
  })

  it('the check finds a code that is missing', () => {
    expect(covered('ERR_NOT_A_CODE')).toBe(false)
    expect(covered('REM_ACCESS_ERR')).toBe(true)
    expect(covered('SUCCESS')).toBe(false)
  })
})
