// Types of packed-entries.mjs (plain JS) for the tests that import it (tsconfig.test.json).

/** The fields of package.json that name files for a consumer. */
export interface PackageEntries { main?: unknown, types?: unknown, typings?: unknown, exports?: unknown, bin?: unknown }

/** Every path package.json names for a consumer, relative to the package root, sorted. */
export function entryFiles(pkg: PackageEntries): string[]
/** The entry files of `pkg` that none of `packed` (tarball paths) provides. */
export function missingEntries(pkg: PackageEntries, packed: readonly string[]): string[]
/** npm pack --dry-run --json in `root`: the paths the tarball would hold. */
export function dryRunPack(root: string): string[]
/** One package in the JSON array `npm pack --json` prints. */
export interface PackJson {
  id: string, name: string, version: string, size: number, unpackedSize: number, shasum: string, integrity: string,
  filename: string, files: Array<{ path: string, size: number, mode: number }>, entryCount: number, bundled: string[]
}
/** The JSON array `npm pack --json` prints, after whatever lifecycle scripts printed to stdout. */
export function parsePackJson(stdout: string): PackJson[]
