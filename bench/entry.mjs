// What the bench scripts that write result files (run.mjs, transfer.mjs) share
// at their entry: the options they all take, and whether this machine has an
// RDMA device (without one they re-run themselves in the Soft-RoCE guest).
import { readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'

/**
 * Takes option `a` (its value from `val()`) into `o` when it is one every bench
 * script has: --out DIR, --from-log FILE, --quiet, --help (prints lines 2 to
 * `helpEnd` of the script's header comment, from `scriptUrl`). Anything else is
 * an unknown option: throws.
 */
export function commonOption(o, a, val, scriptUrl, helpEnd) {
  switch (a) {
    case '--out': o.out = val(); break
    case '--from-log': o.fromLog = val(); break
    case '--quiet': o.quiet = true; break
    case '-h': case '--help':
      console.log(readFileSync(fileURLToPath(scriptUrl), 'utf8').split('\n').slice(1, helpEnd).map((l) => l.replace(/^\/\/ ?/, '')).join('\n'))
      process.exit(0)
    default: throw new Error(`unknown option ${a} (see --help)`)
  }
}

/** Whether the library finds an RDMA device here (false when the addon does not load). */
export async function hasDevice() {
  try {
    const { listDevices } = await import('../dist/index.js')
    return listDevices().length > 0
  } catch {
    return false
  }
}
