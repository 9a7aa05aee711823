import type { Command } from "commander";
import { envVar } from "../config/env-table.ts";
import { refuseArgvSecrets } from "./argv-secrets.ts";

interface UpFlags {
  workers: string;
  model: string;
  policy: string;
  port: string;
  host: string;
  speed?: string;
  simArg?: string[];
  apiKey?: string[];
  drainTimeout: string;
  modelGoneRetry?: string;
}

const collect = (v: string, prev: string[] | undefined): string[] => [...(prev ?? []), v];

export function registerUp(program: Command): void {
  const cmd = program
    .command("up")
    .description("start a local cluster: infera server + N simulated workers, in-memory discovery")
    .option("--workers <n>", "number of sim workers (engines of one infera-sim --fleet process)", "2")
    .option("--model <name>", "model name the workers serve", "sim-model")
    .option(
      "--policy <name>",
      "routing policy (round-robin | kv-aware | kv-aware-classic | approx-prefix)",
      "round-robin",
    )
    .option("--port <port>", "server port", "8000")
    .option("--host <host>", "server address", "127.0.0.1")
    .option("--speed <x>", "sim time runs X times faster than the modelled GPU")
    .option(
      "--sim-arg <arg>",
      "extra argument for every sim (repeatable), e.g. --sim-arg=--block-size=32",
      collect,
    )
    .option(
      "--api-key <key>",
      "refused (argv is public): API keys the server requires in INFERA_API_KEYS (comma-separated)",
      collect,
    )
    .option(
      "--drain-timeout <seconds>",
      "on SIGTERM: like infera server, stop accepting and let requests in flight finish for up to this long",
      "30",
    )
    .option(
      "--model-gone-retry <seconds>",
      "while the workers restart, answer their model 503 + Retry-After for up to this long (default 300)",
    )
    .action(async (f: UpFlags) => {
      const { runUp } = await import("../server/local-cluster.ts");
      await runUp({
        workers: Number(f.workers),
        model: f.model,
        policy: f.policy,
        port: Number(f.port),
        host: f.host,
        speed: f.speed === undefined ? undefined : Number(f.speed),
        simArgs: f.simArg ?? [],
        apiKeys: f.apiKey ?? apiKeysFromEnv(),
        drainTimeoutS: Number(f.drainTimeout),
        modelGoneRetryS: f.modelGoneRetry === undefined ? undefined : Number(f.modelGoneRetry),
      });
    });
  refuseArgvSecrets(cmd, [{ key: "apiKey", env: "INFERA_API_KEYS" }]);
}

/** INFERA_API_KEYS (else INFERA_API_KEY), comma-separated, as `infera server` reads them. */
function apiKeysFromEnv(): string[] {
  const raw = envVar("INFERA_API_KEYS") ?? envVar("INFERA_API_KEY") ?? "";
  return raw
    .split(",")
    .map((k) => k.trim())
    .filter(Boolean);
}
