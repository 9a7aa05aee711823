/**
 * Command-line helpers for the bench runners. `--help` / `-h` prints the runner's usage, which is its file's header
 * comment, and exits 0 before anything starts (without it, any invocation began a run that
 * may take many minutes and spawn a fleet).
 */
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

/** Call first thing with the runner's `import.meta.url` and its arguments. */
export function exitWithUsageIfAsked(metaUrl: string, args: readonly string[]): void {
  if (!args.includes("--help") && !args.includes("-h")) return;
  const src = readFileSync(fileURLToPath(metaUrl), "utf8");
  const header = /^\/\*\*\n([\s\S]*?)\n \*\//.exec(src)?.[1] ?? "";
  process.stdout.write(`${header.replace(/^ \*( |$)/gm, "")}\n`);
  process.exit(0);
}

/**
 * `--name value` pairs, in order, as a map from name (without the dashes) to value; the runners'
 * own flags all take a value.
 */
export function pairedArgs(argv: readonly string[]): Map<string, string> {
  const args = new Map<string, string>();
  for (let i = 0; i < argv.length; i += 2) args.set(argv[i]!.replace(/^--/, ""), argv[i + 1]!);
  return args;
}
