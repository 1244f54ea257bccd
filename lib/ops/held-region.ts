// A region as the request bookkeeping sees it: held while a work request in
// flight names it, released when the device is done with it. The methods are
// keyed by module-private symbols (the package exports only its entry), so
// user code cannot release a region the device still uses.
export const HOLD: unique symbol = Symbol('hold')
export const RELEASE: unique symbol = Symbol('release')

export interface HeldRegion {
  /** A work request naming this region is about to be posted. */
  [HOLD](): void
  /** The device is done with a work request that named this region. */
  [RELEASE](): void
}
