// Checks the shipped declarations (dist/**/*.d.ts) with the TypeScript compiler API:
// - they compile on their own, strict, without skipLibCheck (no declaration names a
//   type that stripInternal removed, no `implements` clause that no longer holds);
// - every type that a public signature names (walking from dist/index.d.ts through
//   exported classes, functions, interfaces and aliases, their public members and
//   everything those name) is itself exported from the entry, so users can import it;
// - no `any` appears in any of them.
// Run by test/unit/90.public-types.test.ts.
import ts from 'typescript'
import { readdirSync } from 'node:fs'
import { join, relative } from 'node:path'

export interface SurfaceReport {
  /** Compiler errors in the .d.ts files, as 'file:line: message'. */
  diagnostics: string[]
  /** Types named by the public API but not exported from the entry, as 'Type (via Path.member)'. */
  unexported: string[]
  /** Places an `any` appears, as 'file:line'. */
  anys: string[]
}

function declarationFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true, recursive: true })
    .filter((entry) => entry.isFile() && entry.name.endsWith('.d.ts'))
    .map((entry) => join(entry.parentPath, entry.name))
    .sort()
}

function where(node: ts.Node, root: string): string {
  const file = node.getSourceFile()
  const { line } = file.getLineAndCharacterOfPosition(node.getStart())
  return `${relative(root, file.fileName)}:${line + 1}`
}

/** Private and protected class members are not part of what a user can reach. */
function isHidden(member: ts.Node): boolean {
  if (ts.isClassElement(member) && member.name !== undefined && ts.isPrivateIdentifier(member.name)) return true
  const flags = ts.canHaveModifiers(member) ? ts.getCombinedModifierFlags(member as ts.Declaration) : 0
  return (flags & (ts.ModifierFlags.Private | ts.ModifierFlags.Protected)) !== 0
}

/** `dist`: the directory with index.d.ts; `root`: where names in the report are relative to and node_modules/@types is. */
export function checkPublicSurface(dist: string, root: string): SurfaceReport {
  const files = declarationFiles(dist)
  const entry = join(dist, 'index.d.ts')
  const program = ts.createProgram(files, {
    strict: true,
    noEmit: true,
    skipLibCheck: false,
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    lib: ['lib.es2023.d.ts', 'lib.esnext.disposable.d.ts'],
    types: ['node'],
    typeRoots: [join(root, 'node_modules', '@types')],
  })
  const checker = program.getTypeChecker()

  // Only our files are checked (checking all of @types/node too would cost a minute on a busy machine).
  const ownFiles = files.map((file) => program.getSourceFile(file)).filter((f) => f !== undefined)
  const found = [...program.getOptionsDiagnostics(), ...program.getGlobalDiagnostics(),
    ...ownFiles.flatMap((f) => [...program.getSyntacticDiagnostics(f), ...program.getSemanticDiagnostics(f)])]
  const diagnostics = found.map((d) => {
    const message = ts.flattenDiagnosticMessageText(d.messageText, '\n')
    if (!d.file || d.start === undefined) return message
    const { line } = d.file.getLineAndCharacterOfPosition(d.start)
    return `${relative(root, d.file.fileName)}:${line + 1}: ${message}`
  })

  const anys: string[] = []
  for (const file of files) {
    const source = program.getSourceFile(file)
    if (!source) continue
    const visit = (node: ts.Node): void => {
      if (node.kind === ts.SyntaxKind.AnyKeyword) anys.push(where(node, root))
      ts.forEachChild(node, visit)
    }
    visit(source)
  }

  const resolve = (symbol: ts.Symbol): ts.Symbol =>
    symbol.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(symbol) : symbol
  const ours = (symbol: ts.Symbol): boolean =>
    (symbol.declarations ?? []).some((d) => d.getSourceFile().fileName.startsWith(dist))

  const entryFile = program.getSourceFile(entry)
  const entryModule = entryFile && checker.getSymbolAtLocation(entryFile)
  if (!entryModule) return { diagnostics: [...diagnostics, `cannot read ${entry}`], unexported: [], anys }
  const exported = new Set(checker.getExportsOfModule(entryModule).map(resolve))

  const unexported = new Set<string>()
  const visited = new Set<ts.Symbol>()

  const reference = (name: ts.Node, path: string): void => {
    const found = checker.getSymbolAtLocation(name)
    const symbol = found && resolve(found)
    if (!symbol || !symbol.declarations?.length) {
      unexported.add(`${name.getText()} (unresolved, via ${path})`)
      return
    }
    if (!ours(symbol) || symbol.flags & ts.SymbolFlags.TypeParameter) return
    if (!exported.has(symbol)) unexported.add(`${symbol.name} (via ${path})`)
    visitSymbol(symbol, symbol.name)
  }

  const visitNode = (node: ts.Node, path: string): void => {
    if (ts.isTypeReferenceNode(node)) reference(node.typeName, path)
    else if (ts.isExpressionWithTypeArguments(node)) reference(node.expression, path)
    else if (ts.isTypeQueryNode(node)) reference(node.exprName, path)
    else if (ts.isImportTypeNode(node) && node.qualifier) reference(node.qualifier, path)
    ts.forEachChild(node, (child) => visitNode(child, path))
  }

  const visitDeclaration = (node: ts.Declaration, path: string): void => {
    if (ts.isClassDeclaration(node) || ts.isInterfaceDeclaration(node)) {
      for (const clause of node.heritageClauses ?? []) visitNode(clause, path)
      for (const parameter of node.typeParameters ?? []) visitNode(parameter, path)
      for (const member of node.members as ts.NodeArray<ts.Node>) {
        if (isHidden(member)) continue
        const name = (member as ts.NamedDeclaration).name
        visitNode(member, `${path}.${name ? name.getText() : 'constructor'}`)
      }
    } else if (ts.isExportSpecifier(node) || ts.isImportSpecifier(node)) {
      // an alias: resolved by the caller
    } else {
      visitNode(node, path)
    }
  }

  function visitSymbol(symbol: ts.Symbol, path: string): void {
    if (visited.has(symbol)) return
    visited.add(symbol)
    for (const declaration of symbol.declarations ?? []) {
      if (declaration.getSourceFile().fileName.startsWith(dist)) visitDeclaration(declaration, path)
    }
  }

  for (const symbol of exported) visitSymbol(symbol, symbol.name)
  return { diagnostics, unexported: [...unexported].sort(), anys }
}
