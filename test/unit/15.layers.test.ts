// The layers of lib/ stay visible: every import (type-only ones included)
// points down the stack of folders, and the runtime imports form no cycle.
// Module resolution is TypeScript's own, over the sources.
import { describe, expect, it } from 'vitest'
import { readdirSync, readFileSync, statSync } from 'node:fs'
import { dirname, join, relative } from 'node:path'
import { fileURLToPath } from 'node:url'
import { importGraph, layerViolations, runtimeCycles, LAYERS } from './layers.js'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const lib = join(root, 'lib')

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name)
    return statSync(path).isDirectory() ? sources(path) : name.endsWith('.ts') ? [path] : []
  })
}

describe('the layers of lib/', () => {
  const files = sources(lib)
  const graph = importGraph(files, root)

  it('every source file is in a known layer', () => {
    const unplaced = files.map((f) => relative(lib, f)).filter((f) => LAYERS.find((l) => l.owns(f)) === undefined)
    expect(unplaced).toEqual([])
  })

  it('imports point down only: no file imports a higher layer or a sibling at its own rank (type-only imports included)', () => {
    expect(layerViolations(graph, lib)).toEqual([])
  })

  it('the runtime imports (not type-only) form no cycle', () => {
    expect(runtimeCycles(graph, lib)).toEqual([])
  })

  it('finds a violation and a cycle when there is one (the check itself)', () => {
    const fake = new Map([
      [join(lib, 'ops/a.ts'), [{ to: join(lib, 'verbs/b.ts'), typeOnly: true }]],
      [join(lib, 'verbs/b.ts'), [{ to: join(lib, 'verbs/c.ts'), typeOnly: false }]],
      [join(lib, 'verbs/c.ts'), [{ to: join(lib, 'verbs/b.ts'), typeOnly: false }]],
    ])
    expect(layerViolations(fake, lib)).toEqual(['ops/a.ts -> verbs/b.ts (type-only): ops may not import verbs'])
    expect(runtimeCycles(fake, lib)).toEqual(['verbs/b.ts -> verbs/c.ts -> verbs/b.ts'])
  })
})

describe('what lib/ takes from Node', () => {
  it('performance comes from node:perf_hooks: in Node 20 the global is a lazy accessor (a getter call per performance.now())', () => {
    const uses = (text: string) => /\bperformance\.now\(/.test(text)
    const imports = (text: string) => /import \{[^}]*\bperformance\b[^}]*\} from 'node:perf_hooks'/.test(text)
    const global = sources(lib).filter((f) => { const text = readFileSync(f, 'utf8'); return uses(text) && !imports(text) })
    expect(global.map((f) => relative(lib, f))).toEqual([])
    // The check itself: a file with the global and no import is found.
    expect(uses('const t = performance.now()') && !imports('const t = performance.now()')).toBe(true)
    expect(Object.getOwnPropertyDescriptor(globalThis, 'performance')?.get).toBeTypeOf('function')
  })
})
