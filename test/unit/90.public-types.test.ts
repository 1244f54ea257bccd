// The published types (dist/*.d.ts), as a consumer sees them: they compile on
// their own, name no `any`, every type a public signature names can be imported
// from the package entry, and a strict consumer (test/types/consumer.ts) compiles
// while each misuse it marks with @ts-expect-error is refused. Needs `npm run build`.
import { beforeAll, describe, expect, it } from 'vitest'
import { spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { checkPublicSurface, type SurfaceReport } from '../types/public-surface.js'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const SLOW = 180_000 // the compiler is slow on a loaded machine; nothing here waits on anything else

describe('the public types', () => {
  let report: SurfaceReport
  beforeAll(() => { report = checkPublicSurface(join(root, 'dist'), root) }, SLOW)

  it('compile on their own (strict, without skipLibCheck): nothing names a stripped @internal type', () => {
    expect(report.diagnostics).toEqual([])
  })

  it('name no `any`', () => {
    expect(report.anys).toEqual([])
  })

  it('are all importable: every type in a public signature is exported from the entry', () => {
    expect(report.unexported).toEqual([])
  })

  it('serve a strict consumer, and refuse the misuses it marks with @ts-expect-error', () => {
    const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc')
    const result = spawnSync(process.execPath, [tsc, '-p', join(root, 'test', 'types', 'tsconfig.json')], { encoding: 'utf8' })
    expect(result.stdout + result.stderr).toBe('')
    expect(result.status).toBe(0)
  }, SLOW)
})

describe('the surface check itself', () => {
  it('reports an unexported type, an any, and a name left dangling by stripInternal', () => {
    const dir = mkdtempSync(join(tmpdir(), 'ibverbs-surface-'))
    try {
      writeFileSync(join(dir, 'index.d.ts'), "export { Thing, make } from './thing.js';\n")
      writeFileSync(join(dir, 'thing.d.ts'), [
        'interface Hidden { x: number }',
        'export interface Options { nested: Hidden }',
        'export declare class Thing { private secret: Secret; open(options: Options): Gone; loose(): any }',
        'interface Secret { y: number }',
        'export declare function make(): Thing;',
      ].join('\n'))
      const found = checkPublicSurface(dir, root)
      expect(found.unexported).toEqual(['Gone (unresolved, via Thing.open)', 'Hidden (via Options.nested)', 'Options (via Thing.open)'])
      expect(found.anys).toHaveLength(1)
      expect(found.diagnostics.join('\n')).toMatch(/Cannot find name 'Gone'/)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }, SLOW)
})
