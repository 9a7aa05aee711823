/**
 * `--help` / `-h` for the bench runners: prints the runner's usage, which is its file's header
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
