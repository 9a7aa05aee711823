/**
 * Reading rendered manifests the way the kubelet would: a container's env with `value`s as
 * given and `secretKeyRef`s taken from the Secrets the same render generated
 * (`secrets: "generate"`), so tests run the rendered processes with exactly what a pod gets.
 */

// biome-ignore lint/suspicious/noExplicitAny: walks nested manifests
type Obj = Record<string, any>;

/** A generated Secret's key, or undefined when the render has no such Secret or key. */
export function secretValue(objs: readonly Obj[], name: string, key: string): string | undefined {
  const s = objs.find((o) => o.kind === "Secret" && o.metadata?.name === name);
  return s?.stringData?.[key] as string | undefined;
}

/**
 * The container's env: `value` (passed through `rewrite`), `secretKeyRef` from the generated
 * Secrets, anything else (fieldRef) from `vars` by name; entries none of these fill are left out.
 */
export function containerEnv(
  c: Obj,
  objs: readonly Obj[],
  opts: { rewrite?: (s: string) => string; vars?: Record<string, string> } = {},
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const e of (c.env ?? []) as Obj[]) {
    if (e.value !== undefined) out[e.name] = opts.rewrite ? opts.rewrite(e.value) : e.value;
    else if (e.valueFrom?.secretKeyRef) {
      const v = secretValue(objs, e.valueFrom.secretKeyRef.name, e.valueFrom.secretKeyRef.key);
      if (v !== undefined) out[e.name] = v;
    } else if (opts.vars?.[e.name] !== undefined) out[e.name] = opts.vars[e.name]!;
  }
  return out;
}
