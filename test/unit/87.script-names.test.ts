// The benches, scripts and examples are plain JavaScript that CI mostly does
// not run (a bench needs minutes in the guest). A name used where it is not in
// scope only fails when that line runs: bench/latency.mjs once called a
// function imported inside another function, and failed in the guest after
// its boot. TypeScript's checker, run over the .mjs files, finds such names.
import { execFileSync } from 'node:child_process'
import { createRequire } from 'node:module'
import { describe, expect, it } from 'vitest'

const root = new URL('../..', import.meta.url).pathname
const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc')
// Cannot find name 'x' / ... Did you mean 'y'? / used before its declaration.
const UNDEFINED_NAME = /error (TS2304|TS2552|TS2448|TS2454):/

describe('scripts', () => {
  it('every .mjs file of bench/, scripts/ and examples/ uses only names in scope', () => {
    const files = execFileSync('git', ['ls-files', '*.mjs'], { cwd: root, encoding: 'utf8' }).split('\n')
      .filter((f) => /^(bench|scripts|examples)\//.test(f))
    expect(files.length).toBeGreaterThan(20)
    let out = ''
    try {
      execFileSync(process.execPath, [tsc, '--allowJs', '--checkJs', '--noEmit', '--skipLibCheck', '--module', 'nodenext',
        '--moduleResolution', 'nodenext', '--target', 'es2022', '--types', 'node', ...files], { cwd: root, encoding: 'utf8' })
    } catch (error) {
      out = (error as { stdout: string }).stdout // other type errors are expected in untyped JavaScript
    }
    expect(out.split('\n').filter((line) => UNDEFINED_NAME.test(line))).toEqual([])
  }, 60_000)
})
