/**
 * The stage of the PD tests that launch engines through `infera engine ...` and route them with
 * `infera server --discovery etcd`: a real etcd with a watcher on the test's prefix, the server
 * on that prefix, and a MoRIIO registration ROUTER (vLLM's MoRIIO workers ping one at
 * proxy_ip:proxy_ping_port, and refuse to start without it: vllm-project/vllm
 * vllm/distributed/kv_transfer/kv_connector/v1/moriio/moriio_common.py @
 * 42fa4c096d406754b7e5c6d93835fe390487c8af). Every child runs in its own process group, killed
 * whole at `close()`, so a launcher and the engine it started go together.
 */
import type { ChildProcess } from "node:child_process";
import { unpack } from "msgpackr";
import * as zmq from "zeromq";
import { EtcdWatcher } from "../../src/discovery/etcd-watcher.ts";
import { type EtcdHandle, startEtcd } from "./etcd.ts";
import { INFERA_BIN, serverArgs, spawnInfera } from "./infera.ts";
import { engineListenArgs } from "./launcher.ts";
import { freePort, isPortRace } from "./ports.ts";
import { spawnTracked } from "./procs.ts";
import { waitFor200, waitUntil } from "./wait.ts";

export interface PdLaunchOptions {
  /** The `infera` words before the flags (`simEngineWords(...)`). */
  words: string[];
  model: string;
  role: "prefill" | "decode";
  connector: string;
  /** Point the worker at the stage's MoRIIO ROUTER (`--moriio-proxy`), with `--moriio-mode` when given. */
  moriio?: { mode?: "read" | "write" };
  /** Sim-only flags, after `--`. */
  simArgs: string[];
}

/** A launched half: its process and the tail of its output. */
export interface PdEngine {
  /** The current attempt's process (a start that lost a port race is started again). */
  proc: ChildProcess;
  output(): string;
}

export interface PdEtcdStage {
  etcd: EtcdHandle;
  watcher: EtcdWatcher;
  serverBase: string;
  serverLog(): string;
  /** MoRIIO registrations received so far, by their `http_address`. */
  pings: ReadonlyMap<string, Record<string, unknown>>;
  /** `infera engine ...` for one half, registered under the stage's prefix as `<model>-<role>`. */
  launch(o: PdLaunchOptions): Promise<PdEngine>;
  /** SIGTERM to a launched half's process group (the launcher deregisters it). */
  stop(e: PdEngine): void;
  /** Waits until the server lists every worker id in `/v1/workers`. */
  serverSees(ids: readonly string[], timeoutMs: number): Promise<void>;
  /** Kills every process group, closes the watcher, etcd and the ROUTER. */
  close(): Promise<void>;
}

export interface PdEtcdStageOptions {
  /** etcd key prefix of the workers (the server's `--discovery-prefix`). */
  prefix: string;
  /** Server output kept for failure messages (characters). */
  serverKeepChars?: number;
}

export async function startPdEtcdStage(o: PdEtcdStageOptions): Promise<PdEtcdStage> {
  const groups: number[] = [];
  /** Halves stopped on purpose: their exit starts nothing again. */
  const stopped = new WeakSet<PdEngine>();
  const moriioProxy = new zmq.Router({ linger: 0 });
  const pings = new Map<string, Record<string, unknown>>();
  await moriioProxy.bind("tcp://127.0.0.1:*");
  const ep = moriioProxy.lastEndpoint ?? "";
  const moriioProxyPort = Number(ep.slice(ep.lastIndexOf(":") + 1));
  void (async () => {
    try {
      // vLLM's `_ping`: a DEALER sends one msgpack map; the ROUTER sees [identity, map].
      for await (const frames of moriioProxy) {
        const msg = unpack(frames[frames.length - 1]) as Record<string, unknown>;
        if (typeof msg?.http_address === "string") pings.set(msg.http_address, msg);
      }
    } catch {
      // closed
    }
  })();
  let etcd: EtcdHandle | undefined;
  let watcher: EtcdWatcher | undefined;
  const close = async () => {
    for (const pid of groups) {
      try {
        process.kill(-pid, "SIGKILL");
      } catch {
        // gone
      }
    }
    await watcher?.close();
    await etcd?.dispose();
    moriioProxy.close();
  };
  try {
    etcd = await startEtcd();
    watcher = new EtcdWatcher({ endpoints: [etcd.endpoint], prefix: o.prefix });
    await watcher.start();
    const port = await freePort();
    const { proc, output } = spawnInfera(
      [
        ...serverArgs(port),
        "--discovery",
        "etcd",
        "--etcd",
        etcd.endpoint,
        "--discovery-prefix",
        o.prefix,
        "--scrape-interval",
        "0",
      ],
      { logLevel: "warn", detached: true, stdout: true, keepChars: o.serverKeepChars ?? 8000 },
    );
    groups.push(proc.pid as number);
    const serverBase = `http://127.0.0.1:${port}`;
    // Listening before any test talks to it (a loaded machine can take seconds to start it).
    await waitFor200(`${serverBase}/health`, { timeoutMs: 30_000, what: "infera server /health", output });
    const stageEtcd = etcd;
    return {
      etcd: stageEtcd,
      watcher,
      serverBase,
      serverLog: output,
      pings,
      close,
      async launch(l) {
        const moriio =
          l.moriio === undefined
            ? []
            : [
                "--moriio-proxy",
                `127.0.0.1:${moriioProxyPort}`,
                ...(l.moriio.mode ? ["--moriio-mode", l.moriio.mode] : []),
              ];
        // Fresh ports on every attempt: each is picked free, but another test process can bind it
        // before this engine does (EADDRINUSE at start-up). Such a start is retried with new
        // ports, up to 3 attempts in all; any other exit is the test's to see.
        const spawnOnce = async (): Promise<ChildProcess> => {
          const child = spawnTracked(
            process.execPath,
            [
              INFERA_BIN,
              ...l.words,
              "--model",
              "sim-model",
              "--served-model-name",
              l.model,
              "--worker-id",
              `${l.model}-${l.role}`,
              "--role",
              l.role,
              "--connector",
              l.connector,
              ...(await engineListenArgs(await freePort())),
              "--bootstrap-port",
              String(await freePort()),
              "--side-channel-port",
              String(await freePort()),
              "--handshake-port",
              String(await freePort()),
              "--notify-port",
              String(await freePort()),
              ...moriio,
              "--etcd-endpoints",
              stageEtcd.endpoint,
              "--etcd-prefix",
              o.prefix,
              "--lease-ttl",
              "3",
              "--",
              ...l.simArgs,
            ],
            {
              // Own process group: the launcher and the engine it runs are stopped together.
              detached: true,
              stdio: ["ignore", "pipe", "pipe"],
              env: { ...process.env, INFERA_LOG_LEVEL: "warn" },
            },
          );
          groups.push(child.pid as number);
          return child;
        };
        let out = "";
        const engine: PdEngine = { proc: await spawnOnce(), output: () => out };
        const attach = (child: ChildProcess, attempt: number) => {
          // This attempt's own output tail (the start-up error is the last thing it prints).
          let attemptOut = "";
          const keep = (b: Buffer) => {
            attemptOut = (attemptOut + b.toString()).slice(-6000);
            out = (out + b.toString()).slice(-6000);
          };
          child.stdout?.on("data", keep);
          child.stderr?.on("data", keep);
          // "close", not "exit": the output is all read by then.
          child.once("close", () => {
            if (stopped.has(engine) || attempt >= 3 || !isPortRace(attemptOut)) return;
            out += `\n[stage] attempt ${attempt} lost a port race; starting again with fresh ports\n`;
            void spawnOnce().then((next) => {
              engine.proc = next;
              attach(next, attempt + 1);
            });
          });
        };
        attach(engine.proc, 1);
        return engine;
      },
      stop(e) {
        stopped.add(e);
        try {
          process.kill(-(e.proc.pid as number), "SIGTERM");
        } catch {
          // gone
        }
      },
      serverSees: (ids, timeoutMs) =>
        waitUntil(
          async () => {
            const body = (await (await fetch(`${serverBase}/v1/workers`)).json()) as {
              data: Array<{ id: string }>;
            };
            return ids.every((id) => body.data.some((w) => w.id === id));
          },
          timeoutMs,
          "server to see the pair",
          25,
        ),
    };
  } catch (err) {
    await close();
    throw err;
  }
}
