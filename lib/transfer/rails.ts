// Rails: the devices an RDMA agent moves data on (options.devices). Rail 0 is
// the device that serves the agent's host. The agent listens on every rail's
// address (rdma-transport.ts) and publishes them all (metadata); a link's
// control channel (rdma_cm) runs on the rail of the address dialed, rail 0
// unless it did not answer, and its data QPs on every rail, whose endpoints
// (one GID per rail) travel in the handshake. A link's lanes are
// laid out rail by rail: lane l is on rail floor(l / qpsPerRail).
// How a transfer's slices are shared between rails follows each rail's
// measured rate (RailMeter), not an equal split.
import { RdmaError } from '../core/errors.js'
import { typeError } from '../core/validate.js'

/** The most rails an agent opens. */
export const MAX_RAILS = 4

/** options.devices, checked: the rail devices' names in order, or undefined (one rail: options.device or the one serving host). */
export function railDevices(devices: unknown, device: unknown, transport: unknown): string[] | undefined {
  if (devices === undefined) return undefined
  if (transport === 'tcp') {
    throw new RdmaError('options.devices names RDMA devices (rails); the TCP transport has none: leave devices out, or use transport \'rdma\'', { code: 'ERR_INVALID_ARG_VALUE' })
  }
  if (device !== undefined) {
    throw new RdmaError('options.device and options.devices both name the device: give devices alone (its first entry is the device of host)', { code: 'ERR_INVALID_ARG_VALUE' })
  }
  if (!Array.isArray(devices) || devices.length < 1 || devices.length > MAX_RAILS) throw typeError(`a list of 1..${MAX_RAILS} device names`, 'options.devices', devices)
  const names: string[] = []
  for (let i = 0; i < devices.length; i++) {
    const name: unknown = devices[i]
    if (typeof name !== 'string' || name.length === 0) throw typeError('a device name', `options.devices[${i}]`, name)
    if (names.includes(name)) throw new RdmaError(`options.devices names ${name} twice: each rail is a device of its own`, { code: 'ERR_INVALID_ARG_VALUE' })
    names.push(name)
  }
  return names
}

/** The rail of lane `lane` on a link with `perRail` lanes per rail. */
export function railOf(lane: number, perRail: number): number {
  return Math.floor(lane / perRail)
}

/** Weight of the running average of a rail's rate given to each new measure. */
const ALPHA = 0.3
/** A rail never gets less than this share while it is up, so that its rate keeps being measured. */
const FLOOR = 0.05

/**
 * The measured rate of each rail of a link (bytes per ms, a running average
 * over transfers), and whether it is up. Rates start unknown (equal shares);
 * a rail that failed is down (share 0) until the link is made anew.
 */
export class RailMeter {
  readonly #rate: Float64Array
  readonly #down: boolean[]

  constructor(readonly rails: number) {
    this.#rate = new Float64Array(rails)
    this.#down = new Array<boolean>(rails).fill(false)
  }

  isDown(rail: number): boolean { return this.#down[rail] === true }
  /** Rails not marked down. */
  get up(): number { return this.#down.filter((d) => !d).length }
  get anyDown(): boolean { return this.#down.some((d) => d) }
  markDown(rail: number): void { this.#down[rail] = true }

  /** A transfer moved `bytes` on `rail`, its last completion `ms` after the transfer started. */
  record(rail: number, bytes: number, ms: number): void {
    if (bytes <= 0 || !(ms > 0)) return
    const rate = bytes / ms
    const old = this.#rate[rail]!
    this.#rate[rail] = old === 0 ? rate : old + ALPHA * (rate - old)
  }

  /** The rates measured so far (0: not yet). */
  rates(): number[] { return [...this.#rate] }

  /**
   * Each rail's share of the next transfer's bytes: in proportion to its
   * rate (a rail not measured yet counts as the mean of those that were),
   * each rail up at least FLOOR, a rail down 0. Sums to 1.
   */
  shares(): number[] {
    const up: number[] = []
    for (let r = 0; r < this.rails; r++) if (!this.#down[r]) up.push(r)
    const out = new Array<number>(this.rails).fill(0)
    if (up.length === 0) return out
    const known = up.filter((r) => this.#rate[r]! > 0)
    const mean = known.length === 0 ? 1 : known.reduce((s, r) => s + this.#rate[r]!, 0) / known.length
    let sum = 0
    for (const r of up) sum += out[r] = this.#rate[r]! > 0 ? this.#rate[r]! : mean
    for (const r of up) out[r] = out[r]! / sum
    // The floor, taken from the others in proportion.
    const low = up.filter((r) => out[r]! < FLOOR)
    if (low.length > 0 && low.length < up.length) {
      const rest = up.filter((r) => out[r]! >= FLOOR)
      const restSum = rest.reduce((s, r) => s + out[r]!, 0)
      const left = 1 - FLOOR * low.length
      for (const r of low) out[r] = FLOOR
      for (const r of rest) out[r] = (out[r]! / restSum) * left
    }
    return out
  }

  /** Per lane (`perRail` lanes per rail): its rail's share split equally between the rail's lanes. */
  laneWeights(perRail: number): Float64Array {
    const shares = this.shares()
    const weights = new Float64Array(this.rails * perRail)
    for (let l = 0; l < weights.length; l++) weights[l] = shares[railOf(l, perRail)]! / perRail
    return weights
  }
}
