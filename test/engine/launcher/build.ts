/** Shared by the launcher's command-line tests: flags → spec → command + record preview. */
import type { EngineKind } from "../../../src/discovery/types.ts";
import { engineAdapters } from "../../../src/engine/launcher/index.ts";
import { buildLaunchSpec, type LaunchFlags } from "../../../src/engine/launcher/options.ts";
import { buildWorkerRecord } from "../../../src/engine/launcher/record.ts";

export const BASE: LaunchFlags = {
  model: "org/model",
  port: "8100",
  host: "0.0.0.0",
  advertiseHost: "10.0.0.5",
};

export async function build(engine: EngineKind, flags: LaunchFlags = {}, extra: string[] = []) {
  const spec = await buildLaunchSpec(engine, { ...BASE, ...flags }, extra);
  const adapter = engineAdapters[engine];
  const cmd = adapter.build(spec);
  return { spec, cmd, record: buildWorkerRecord(spec, adapter, { startedAt: new Date(0) }) };
}

/** Value after `flag`. */
export function flagValue(argv: readonly string[], flag: string): string | undefined {
  const i = argv.indexOf(flag);
  return i < 0 ? undefined : argv[i + 1];
}

/** A JSON-valued flag, parsed. */
export function json(argv: readonly string[], flag: string): Record<string, unknown> | undefined {
  const v = flagValue(argv, flag);
  return v === undefined ? undefined : (JSON.parse(v) as Record<string, unknown>);
}
