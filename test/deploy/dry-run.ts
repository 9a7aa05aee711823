/**
 * Runs rendered worker containers' commands through the real `infera` commander program
 * (buildProgram(), in a child process) with `--dry-run`, after expanding `$(VAR)` the way the
 * kubelet does from the container's env. Returns the launcher's JSON for each: the engine's
 * argv and env, and the worker record.
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { LAUNCHER_BIN } from "../../src/deploy/render/context.ts";

export interface DryRun {
  argv: string[];
  env: Record<string, string>;
  record: Record<string, unknown>;
}

export interface ContainerLike {
  command?: string[];
  env?: { name: string; value?: string }[];
}

/** `$(NAME)` → the value the kubelet would substitute (downward-API values given by the test). */
export function expand(words: readonly string[], vars: Record<string, string>): string[] {
  return words.map((w) => w.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, n: string) => vars[n] ?? m));
}

export async function engineDryRuns(
  cs: readonly ContainerLike[],
  vars: Record<string, string>,
): Promise<DryRun[]> {
  const jobs = cs.map((c) => {
    const words = expand(c.command ?? [], vars);
    if (words[0] !== LAUNCHER_BIN || words[1] !== "engine")
      throw new Error(`not a launcher command: ${words[0]}`);
    const sep = words.indexOf("--");
    const flags = sep < 0 ? words.slice(1) : words.slice(1, sep);
    const rest = sep < 0 ? [] : words.slice(sep);
    // Literal env values reach commander's .env() options, as in the pod.
    const env: Record<string, string> = { ...vars };
    for (const e of c.env ?? []) if (e.value !== undefined) env[e.name] = e.value;
    return { args: [...flags, "--dry-run", ...rest], env };
  });
  const { stdout } = await promisify(execFile)(
    process.execPath,
    ["test/deploy/dry-run-child.ts", JSON.stringify(jobs)],
    { maxBuffer: 64 * 1024 * 1024 },
  );
  const results = JSON.parse(stdout) as ({ ok: true; out: DryRun } | { ok: false; error: string })[];
  return results.map((r, i) => {
    if (!r.ok) throw new Error(`infera ${jobs[i]!.args.join(" ")}: ${r.error}`);
    return r.out;
  });
}
