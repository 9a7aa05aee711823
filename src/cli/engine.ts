import type { Command } from "commander";
import { envVar } from "../config/env-table.ts";
import { addEtcdFlags } from "../discovery/etcd-client.ts";
import type { EngineCliFlags } from "../engine/launcher/cli-action.ts";
import { addNatsOptions } from "../transport/nats/cli-options.ts";
import { natsArgvSecrets, refuseArgvSecrets } from "./argv-secrets.ts";

const collect = (v: string, prev: string[] = []) => [...prev, v];

/**
 * `infera engine <vllm|sglang|atom|sim> [options] [-- extra engine args]`: starts one engine
 * with its real command line, waits for health, registers it in discovery with a lease,
 * and deregisters when it stops.
 */
export function registerEngine(program: Command): void {
  const cmd = program
    .command("engine")
    .description("start one engine (vllm|sglang|atom|sim), register it in discovery, deregister on exit")
    .argument("<engine>", "vllm | sglang | atom | sim")
    .argument("[engineArgs...]", "extra engine arguments (after --), passed through untouched")
    .requiredOption("--model <model>", "model path or name the engine loads")
    .option("--served-model-name <name>", "name clients use (repeatable or comma-separated)", collect)
    .option("--host <host>", "address the engine binds", "0.0.0.0")
    .option("--port <port>", "engine HTTP port", "8000")
    .option(
      "--advertise-host <host>",
      "address others reach this worker at (default: bind host or first IPv4)",
    )
    .option("--worker-id <id>", "worker id (default: <engine>-<hostname>-<port>-<random>)")
    .option("--role <role>", "mixed | prefill | decode", "mixed")
    .option(
      "--connector <kind>",
      "KV connector: nixl | mooncake | moriio | mori (sglang's name) | sglang | atom (sim) | none; " +
        "PD default: vllm/sim nixl, sglang mooncake, atom moriio",
    )
    .option("--tp <n>", "tensor-parallel size")
    .option("--dp <n>", "data-parallel size")
    .option("--quantization <q>", "fp8 | mxfp4 | ... (passed to the engine)")
    .option("--kv-cache-dtype <dtype>", "e.g. fp8")
    .option("--block-size <n>", "KV block (page) size in tokens")
    .option("--max-model-len <n>", "context length (also read from the engine's /v1/models)")
    .option("--no-kv-events", "do not enable KV cache events")
    .option("--kv-events-port <port>", "KV events PUB port of DP rank 0 (rank r: port + r)", "5557")
    .option(
      "--kv-events-replay-port <port>",
      "KV events replay ROUTER port of DP rank 0, vLLM/SGLang (rank r: port + r; default: PUB port + dp)",
    )
    .option("--kv-events-topic <topic>", "KV events topic", "kv-events")
    .option("--bootstrap-port <port>", "Mooncake / SGLang bootstrap port", "8998")
    .option("--side-channel-port <port>", "Nixl side-channel port", "5600")
    .option("--handshake-port <port>", "MoRIIO / ATOM handshake port", "6301")
    .option("--notify-port <port>", "MoRIIO notify port", "61005")
    .option(
      "--moriio-proxy <host:port>",
      "MoRIIO registration socket of the infera server (--discovery moriio; port 36367 by " +
        "default; env INFERA_MORIIO_PROXY): proxy_ip, proxy_ping_port. Required for vllm --connector moriio",
    )
    .option(
      "--moriio-mode <mode>",
      "MoRIIO transfer mode: read (decode pulls) | write (vLLM's default)",
      "read",
    )
    .option("--ib-device <dev>", "RDMA device (SGLang --disaggregation-ib-device; show_gids filter)")
    .option("--gid-index <n|auto>", "RoCEv2 GID index for MC_GID_INDEX / NCCL_IB_GID_INDEX; auto = show_gids")
    .option("--show-gids-cmd <cmd>", "command printing show_gids output (env INFERA_SHOW_GIDS_CMD)")
    .option("--engine-bin <cmd>", "engine executable, may be several words (e.g. 'sglang serve')")
    .option(
      "--otlp-endpoint <url>",
      "OTLP/HTTP collector (e.g. http://collector:4318): the engine traces requests there (vLLM, SGLang)",
    )
    .option(
      "--sim",
      "run the simulator in this engine's personality (vllm|sglang|atom): same arguments and " +
        "environment, executable replaced by `node bin/infera-sim.js --engine <kind>`",
    )
    .option("--dry-run", "print the command, environment and record preview as JSON, then exit")
    .option("--discovery <kind>", "etcd | none", envVar("INFERA_DISCOVERY") ?? "etcd")
    .option("--lease-ttl <seconds>", "etcd lease TTL", "10")
    .option("--health-timeout <seconds>", "how long to wait for the engine's /health", "1800")
    .option("--health-interval <seconds>", "health check period once registered (0 = off)", "5")
    .option("--stop-timeout <seconds>", "SIGKILL the engine this long after a forwarded signal", "30")
    .option(
      "--drain-timeout <seconds>",
      "on SIGTERM: deregister, then wait up to this long for the engine's running and waiting " +
        "requests to finish before forwarding the signal (0 = forward at once)",
      "60",
    );
  addEtcdFlags(cmd);
  addNatsOptions(cmd);
  refuseArgvSecrets(cmd, [
    { key: "etcdPassword", env: "INFERA_ETCD_PASSWORD" },
    { key: "etcd", env: "INFERA_ETCD", url: "password" },
    { key: "etcdEndpoints", env: "INFERA_ETCD_ENDPOINTS", url: "password" },
    ...natsArgvSecrets(false),
  ]);
  cmd.action(async (engine: string, engineArgs: string[], flags: EngineCliFlags) => {
    const { runEngineCommand } = await import("../engine/launcher/cli-action.ts");
    process.exitCode = await runEngineCommand(engine, engineArgs, flags);
  });
}
