// Tests that need something the environment may not give (an address, a
// throwaway guest). Never skip silently: a skipped test says why in its name,
// and under CI (CI=true or NODE_IBVERBS_REQUIRE_RDMA=1) it fails instead,
// because everything these suites test is supported by rxe in the guest.
import { it } from 'vitest'

export const requireRdma = process.env.CI === 'true' || process.env.NODE_IBVERBS_REQUIRE_RDMA === '1'

type TestFn = () => unknown
type Register = (name: string, fn: TestFn, timeout?: number) => void

/** `it` when `missing` is undefined; else a test that is skipped with that reason (or fails with it under CI). */
export function needs(missing: string | undefined): Register {
  if (missing === undefined) return (name, fn, timeout) => it(name, fn, timeout)
  if (requireRdma) {
    return (name) => it(name, () => {
      throw new Error(`cannot run: ${missing}; skipping is not allowed under CI / NODE_IBVERBS_REQUIRE_RDMA=1`)
    })
  }
  return (name, fn) => it.skip(`${name} [skipped: ${missing}]`, fn)
}

/** The reason a variable is missing, or undefined when it is set. */
export function envMissing(...names: string[]): string | undefined {
  const absent = names.filter((name) => !process.env[name])
  return absent.length ? `${absent.join(' and ')} not set by the environment (scripts/softroce.sh sets it)` : undefined
}
