// Command-line options for the example programs: node:util's parseArgs with
// --help, a usage message on bad input (exit 2), integer options, and the
// address to listen on when --host is not given.
import { parseArgs } from 'node:util'
import { openDevice } from 'node-ibverbs'

/**
 * Parses process.argv with `options` (--help is added). Returns the values,
 * the positionals, and int(name, min, max) for an integer option.
 */
export function exampleArgs(usage, options, { allowPositionals = false } = {}) {
  let args
  try {
    args = parseArgs({ allowPositionals, options: { ...options, help: { type: 'boolean', short: 'h', default: false } } })
  } catch (error) {
    console.error(`${error.message}\n${usage}`)
    process.exit(2)
  }
  if (args.values.help) {
    console.log(usage)
    process.exit(0)
  }
  const int = (name, min, max) => {
    const n = Number(args.values[name])
    if (!Number.isInteger(n) || n < min || n > max) {
      console.error(`--${name} must be an integer in [${min}, ${max}], got ${args.values[name]}\n${usage}`)
      process.exit(2)
    }
    return n
  }
  return { values: args.values, positionals: args.positionals, int }
}

/**
 * The address to listen on: `host` (the --host option), else $SOFTROCE_ADDR,
 * else the IPv4 address of `device` (its RoCE v2 GID; the first device if none).
 */
export function localAddress(host, device) {
  if (host) return host
  if (process.env.SOFTROCE_ADDR) return process.env.SOFTROCE_ADDR
  const d = openDevice(device || undefined)
  const v4 = d.gids(1).find((g) => g.gid.startsWith('::ffff:'))
  d.close()
  if (!v4) throw new Error(`${d.name} has no IPv4 address for rdma_cm: pass --host`)
  return v4.gid.slice('::ffff:'.length)
}
