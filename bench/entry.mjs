// What the bench scripts share at their entry: the options that run.mjs and
// transfer.mjs both take, whether this machine has an RDMA device (without one
// they re-run themselves in the Soft-RoCE guest), and running main() only when
// a script is started rather than imported (run.mjs imports the others).
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

/** Runs `main(argv)` when `scriptUrl` is the script node was started with (not when it is imported); a failure prints `name: stack` and exits 1. */
export function runIfMain(scriptUrl, main, name) {
  if (process.argv[1] !== fileURLToPath(scriptUrl)) return
  main(process.argv.slice(2)).catch((e) => {
    console.error(`${name}: ${e?.stack ?? e}`)
    process.exit(1)
  })
}
