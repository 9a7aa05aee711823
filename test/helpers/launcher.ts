import { freePortRun } from "./ports.ts";

/** The engine personalities the simulator takes through `infera engine <kind> --sim`. */
export type SimPersonality = "vllm" | "sglang" | "atom";

/**
 * The `infera` words that start a simulated engine: `engine sim` (the vLLM personality with
 * the sim's own --role/--connector, as before) or `engine <kind> --sim`, which runs
 * `node bin/infera-sim.js --engine <kind>` with exactly the real engine's arguments and
 * environment and registers the real kind. Sim-only tuning (`--speed`, ...) goes after `--`.
 */
export function simEngineWords(as: SimPersonality | "sim" = "sim"): string[] {
  return as === "sim" ? ["engine", "sim"] : ["engine", as, "--sim"];
}

/**
 * The listen flags an `infera engine ...` launcher is given in tests: HTTP on 127.0.0.1:`port`,
 * KV events and their replay on free ports — `dp` consecutive ones each, since rank r binds
 * base + r.
 */
export async function engineListenArgs(port: number, opts: { dp?: number } = {}): Promise<string[]> {
  const dp = opts.dp ?? 1;
  // Checked on all interfaces: the engines bind their KV sockets there.
  const pub = await freePortRun(dp, "0.0.0.0");
  let replay = await freePortRun(dp, "0.0.0.0");
  // The two ranges must not overlap (the launcher refuses that).
  while (replay < pub + dp && pub < replay + dp) replay = await freePortRun(dp, "0.0.0.0");
  return [
    "--host",
    "127.0.0.1",
    "--port",
    String(port),
    "--kv-events-port",
    String(pub),
    "--kv-events-replay-port",
    String(replay),
  ];
}
