// The import graph of lib/ as TypeScript resolves it, and the rules of its
// layers (docs/architecture.md): each folder has a rank; a file may import
// files of its own folder and of lower ranks only.
import ts from 'typescript'
import { relative, sep } from 'node:path'

export interface Edge { to: string; typeOnly: boolean }

/** Bottom up. index.ts (the package entry) may import everything; cli only the entry. */
export const LAYERS: ReadonlyArray<{ name: string; rank: number; owns(file: string): boolean }> = [
  folder('core', 0),
  folder('native', 1),
  folder('ops', 2),
  folder('verbs', 3),
  folder('cm', 4),
  folder('transfer', 5),
  folder('locks', 5),
  { name: 'index', rank: 6, owns: (f) => f === 'index.ts' },
  folder('cli', 7),
]

function folder(name: string, rank: number) {
  return { name, rank, owns: (f: string) => f.startsWith(name + sep) || f.startsWith(name + '/') }
}

const layerOf = (file: string) => LAYERS.find((l) => l.owns(file))

/** The files each file imports (import and export declarations, `import type` included), resolved as tsc resolves them. */
export function importGraph(files: readonly string[], root: string): Map<string, Edge[]> {
  const parsed = ts.getParsedCommandLineOfConfigFile(`${root}/tsconfig.json`, {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: () => {} })
  const options = parsed?.options ?? {}
  const graph = new Map<string, Edge[]>()
  for (const file of files) {
    const source = ts.createSourceFile(file, ts.sys.readFile(file) ?? '', ts.ScriptTarget.Latest, true)
    const edges: Edge[] = []
    for (const statement of source.statements) {
      let specifier: ts.Expression | undefined
      let typeOnly = false
      if (ts.isImportDeclaration(statement)) {
        specifier = statement.moduleSpecifier
        const clause = statement.importClause
        typeOnly = clause !== undefined && (clause.isTypeOnly ||
          (clause.name === undefined && clause.namedBindings !== undefined && ts.isNamedImports(clause.namedBindings) &&
            clause.namedBindings.elements.length > 0 && clause.namedBindings.elements.every((e) => e.isTypeOnly)))
      } else if (ts.isExportDeclaration(statement) && statement.moduleSpecifier !== undefined) {
        specifier = statement.moduleSpecifier
        typeOnly = statement.isTypeOnly
      }
      if (specifier === undefined || !ts.isStringLiteral(specifier)) continue
      const resolved = ts.resolveModuleName(specifier.text, file, options, ts.sys).resolvedModule
      if (resolved === undefined || resolved.isExternalLibraryImport) continue
      edges.push({ to: resolved.resolvedFileName, typeOnly })
    }
    graph.set(file, edges)
  }
  return graph
}

export function layerViolations(graph: Map<string, Edge[]>, lib: string): string[] {
  const out: string[] = []
  for (const [file, edges] of graph) {
    const from = relative(lib, file)
    const mine = layerOf(from)
    for (const edge of edges) {
      const to = relative(lib, edge.to)
      const theirs = layerOf(to)
      if (mine === undefined || theirs === undefined || mine === theirs) continue
      const allowed = mine.name === 'cli' ? theirs.name === 'index' : theirs.rank < mine.rank
      if (!allowed) out.push(`${from} -> ${to}${edge.typeOnly ? ' (type-only)' : ''}: ${mine.name} may not import ${theirs.name}`)
    }
  }
  return out.sort()
}

/** Cycles among runtime (not type-only) imports, each once, from its smallest file. */
export function runtimeCycles(graph: Map<string, Edge[]>, lib: string): string[] {
  const found = new Set<string>()
  const state = new Map<string, 'active' | 'done'>()
  const stack: string[] = []
  const visit = (file: string): void => {
    state.set(file, 'active')
    stack.push(file)
    for (const edge of graph.get(file) ?? []) {
      if (edge.typeOnly) continue
      const s = state.get(edge.to)
      if (s === 'active') {
        const cycle = stack.slice(stack.indexOf(edge.to)).map((f) => relative(lib, f))
        const start = cycle.indexOf([...cycle].sort()[0]!)
        const rotated = [...cycle.slice(start), ...cycle.slice(0, start)]
        found.add([...rotated, rotated[0]].join(' -> '))
      } else if (s === undefined) {
        visit(edge.to)
      }
    }
    stack.pop()
    state.set(file, 'done')
  }
  for (const file of graph.keys()) if (!state.has(file)) visit(file)
  return [...found].sort()
}
