// The CLI's progress line (lib/cli/progress.ts): bytes, rate and time left,
// drawn in place on a terminal at most every 200 ms and cleared at the end;
// nothing at all on a stream that is not a terminal. And the command itself:
// `node-ibverbs bench transfer` piped prints its summary and no progress.
import { describe, expect, it } from 'vitest'
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { formatBytes, formatDuration, formatProgress, ProgressLine } from '../../lib/cli/progress.js'

const MiB = 1 << 20

function stream(isTTY: boolean): { isTTY: boolean; columns: number; out: string; write(text: string): void } {
  return { isTTY, columns: 80, out: '', write(text: string) { this.out += text } }
}

describe('progress line', () => {
  it('formats bytes, rate and time left', () => {
    expect(formatBytes(0)).toBe('0 B')
    expect(formatBytes(1536)).toBe('1.5 KiB')
    expect(formatBytes(4.5 * 1024 * MiB)).toBe('4.5 GiB')
    expect(formatDuration(59.4)).toBe('59s')
    expect(formatDuration(70)).toBe('1m 10s')
    expect(formatDuration(3 * 3600 + 5 * 60)).toBe('3h 05m')
    expect(formatProgress('write', 0, 100 * MiB, 0)).toBe('write: 0 B / 100 MiB (0%)')
    expect(formatProgress('write', 25 * MiB, 100 * MiB, 0.5)).toBe('write: 25.0 MiB / 100 MiB (25%), 50.0 MiB/s, ETA 2s')
  })

  it('on a terminal: redrawn in place at most every 200 ms (and at the end), then cleared', () => {
    let now = 0
    const tty = stream(true)
    const line = new ProgressLine(tty, 'read', 100 * MiB, () => now)
    now = 1000
    line.update(10 * MiB)
    now = 1100
    line.update(20 * MiB) // within 200 ms: not drawn
    now = 1300
    line.update(30 * MiB)
    now = 1350
    line.update(100 * MiB) // the end is always drawn
    const draws = tty.out.split('\r').filter(Boolean)
    expect(draws.map((d) => d.trimEnd())).toEqual([
      'read: 10.0 MiB / 100 MiB (10%), 10.0 MiB/s, ETA 9s',
      'read: 30.0 MiB / 100 MiB (30%), 23.1 MiB/s, ETA 3s',
      'read: 100 MiB / 100 MiB (100%), 74.1 MiB/s, ETA 0s',
    ])
    line.end()
    expect(tty.out.endsWith(`\r${' '.repeat(draws.at(-1)!.length)}\r`), 'the line is cleared').toBe(true)
  })

  it('not a terminal: writes nothing', () => {
    const piped = stream(false)
    const line = new ProgressLine(piped, 'write', MiB, () => 1000)
    line.update(MiB / 2)
    line.update(MiB)
    line.end()
    expect(line.drawing).toBe(false)
    expect(piped.out).toBe('')
  })

  it('`node-ibverbs bench transfer` piped (TCP, no device): the summary table on stdout, no progress on stderr', () => {
    const cli = fileURLToPath(new URL('../../dist/cli/main.js', import.meta.url))
    const r = spawnSync(process.execPath, [cli, 'bench', 'transfer', '--transport', 'tcp', '--blocks', '256', '--block-size', '4096', '--qps', '1'], { encoding: 'utf8', timeout: 60_000 })
    expect(r.status, r.stderr).toBe(0)
    expect(r.stdout).toMatch(/BW average\[MB\/sec\]/)
    expect(r.stderr).not.toMatch(/\r|ETA/)
  }, 70_000)
})
