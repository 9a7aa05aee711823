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

/**
 * The kubelet's expansion of one command/args word: `$(NAME)` → the variable's value (left as
 * written when unknown), `$$` → `$`, an unclosed `$(` and any other `$x` kept. A port of
 * kubernetes/kubernetes third_party/forked/golang/expansion/expand.go (Expand and
 * tryReadVariableName) @ fde22c3f9aacfd260225a9741de123a41157b7c0.
 */
export function kubeExpand(input: string, vars: Record<string, string>): string {
  let out = "";
  let i = 0;
  while (i < input.length) {
    const c = input[i]!;
    if (c !== "$" || i + 1 >= input.length) {
      out += c;
      i++;
      continue;
    }
    const next = input[i + 1]!;
    if (next === "$") {
      out += "$";
      i += 2;
    } else if (next === "(") {
      const close = input.indexOf(")", i + 2);
      if (close < 0) {
        out += "$(";
        i += 2;
      } else {
        const name = input.slice(i + 2, close);
        out += vars[name] ?? `$(${name})`;
        i = close + 1;
      }
    } else {
      out += `$${next}`;
      i += 2;
    }
  }
  return out;
}

/** Every word expanded as the kubelet does (downward-API values given by the test). */
export function expand(words: readonly string[], vars: Record<string, string>): string[] {
  return words.map((w) => kubeExpand(w, vars));
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
