// Command-line options for the example programs: node:util's parseArgs with
// --help, a usage message on bad input (exit 2), and integer options.
import { parseArgs } from 'node:util'

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
