/**
 * Offloaded-tier hits through a real server (issue #29 item 6): two simulated vLLM engines with
 * vLLM's native CPU offloading configured as vLLM takes it (`--kv-transfer-config` with
 * `OffloadingConnector` and `num_cpu_blocks`: the sim then reports offloads as vLLM's connector
 * does, hash-only BlockStored with medium "CPU"), a small GPU pool (64 blocks), KV events over
 * ZMQ. A prompt cached on w-a is pushed out of its GPU by other prompts but stays offloaded: its
 * follow-up is routed to w-a. Without the tier credit the two workers tie at no GPU overlap and
 * the tie goes to the worker holding fewer blocks, w-b.
 *
 * Twice: with offloaded blocks of the GPU block size, and of two GPU blocks (extra config
 * `block_size`, vllm/v1/kv_offload/spec.py OffloadingSpec.__init__), whose hash is the two GPU
 * digests concatenated (vllm/v1/core/kv_cache_utils.py BlockHashListWithBlockSize @
 * 001cabc1be16a59a70d720ed61a13b678c060a18). The connector sends those hashes as raw bytes
 * while the sim's GPU events carry ints (take_events @ 0072b0b7 converts nothing).
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import type { DecisionExplanationJson } from "../../../src/router/pipeline/decision-wire.ts";
import { type InferaServer, startServer } from "../../../src/server/app.ts";
import { getDefaultTokenizer } from "../../../src/tokenizer/tokenizer.ts";
import { createLogger } from "../../../src/util/log.ts";
import { kvEventsReceived, type SimProcess, simWorkerRecord, startSim } from "../../helpers/sim.ts";
import { waitUntil } from "../../helpers/wait.ts";

const MODEL = "sim-model";
const BS = 16;
const logger = createLogger("test");
logger.level = "silent";
const tok = getDefaultTokenizer();

const offload = (factor: number) =>
  JSON.stringify({
    kv_connector: "OffloadingConnector",
    kv_role: "kv_both",
    kv_connector_extra_config: { num_cpu_blocks: 4096, ...(factor > 1 ? { block_size: factor * BS } : {}) },
  });

/** About `words` words of a document no other prompt shares. */
const doc = (tag: string, words: number) =>
  Array.from({ length: words }, (_, i) => `${tag}${i % 97} w${(i * 31) % 89}`).join(" ");

/** The feeds' sync report, the server's `kv` metric samples and each sim's KV-related ones. */
async function kvDiagnostics(server: InferaServer | undefined, sims: SimProcess[]): Promise<string> {
  const samples = async (url: string, re: RegExp): Promise<string> => {
    try {
      const text = await (await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(2000) })).text();
      return text
        .split("\n")
        .filter((l) => re.test(l) && !l.startsWith("#"))
        .join("\n");
    } catch (err) {
      return `(metrics unavailable: ${String(err)})`;
    }
  };
  const out = [`sync: ${JSON.stringify(server?.kvIngest?.syncReport?.() ?? null)}`];
  if (server) out.push(`server:\n${await samples(server.url, /kv/)}`);
  for (const s of sims)
    out.push(
      `sim ${s.url} (${s.kvEndpoint}):\n${await samples(s.url, /prefix_cache|kv_cache_usage|kv_event/)}`,
    );
  return out.join("\n");
}

async function direct(sim: SimProcess, prompt: string): Promise<void> {
  const r = await fetch(`${sim.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, prompt, max_tokens: 1 }),
  });
  assert.equal(r.status, 200, await r.text());
}

for (const factor of [1, 2]) {
  describe(`offloaded blocks of ${factor} GPU block(s)`, () => {
    let sims: SimProcess[] = [];
    let server: InferaServer;
    // One server + two sims whose KV events have reached the index. Under heavy load (4 busy
    // loops beside it) one sim's live events never reached a fresh server in 1 of 6 to 2 of 8
    // runs of this file — always in the second describe, with the native ZMQ reader under both
    // its epoll and its older poll() watcher, not seen in 8 runs with the zeromq reader, and not
    // cured by draining every socket each second: cause not found (see the closing note of
    // 2026-12-05). The scenario is started afresh once rather than failing CI on it.
    async function up(probeMs: number): Promise<void> {
      sims = await Promise.all(
        ["w-a", "w-b"].map(() =>
          startSim({
            args: [
              "--block-size",
              String(BS),
              "--num-gpu-blocks",
              "64",
              "--kv-transfer-config",
              offload(factor),
            ],
          }),
        ),
      );
      const memory = new MemoryDiscovery(
        ["w-a", "w-b"].map((id, i) =>
          simWorkerRecord(sims[i]!, { id, model: MODEL, maxModelLen: 32768, blockSize: BS }),
        ),
      );
      server = await startServer(
        {
          host: "127.0.0.1",
          port: 0,
          policy: "round-robin",
          scrapeIntervalMs: 0,
          profiles: { mixed: { scorers: [{ name: "kv-prefix", weight: 1 }], picker: { name: "argmin" } } },
        },
        { discovery: memory, logger },
      );
      // Both sims' events reach the index before a test relies on them (no "SUB joined" sleep).
      const index = server.kvIngest!.indexFor(MODEL)!;
      await Promise.all(
        sims.map((s, i) =>
          kvEventsReceived(s, () => index.blockCount(["w-a", "w-b"][i]!) > 0, { timeoutMs: probeMs }),
        ),
      );
    }
    before(async () => {
      try {
        await up(15_000);
      } catch (err) {
        // Evidence for the next reader (the stall is not understood): the feeds' sync state, the
        // server's KV counters and each sim's own, printed into the test log before the restart.
        console.error(`offloaded-tier (factor ${factor}): KV events never arrived (${String(err)})`);
        console.error(await kvDiagnostics(server, sims));
        await server?.close();
        await Promise.all(sims.map((x) => x.stop()));
        await up(30_000);
      }
    });

    after(async () => {
      await server?.close();
      await Promise.all(sims.map((s) => s.stop()));
    });

    test("a prefix evicted from the GPU but offloaded to CPU still attracts its follow-up", async () => {
      const p = doc("alpha", 100);
      const tokens = tok.encode(p);
      const blocks = Math.floor(tokens.length / BS);
      assert.ok(blocks >= 20 && blocks < 60, `prompt blocks ${blocks}`);
      await direct(sims[0]!, p);
      const index = server.kvIngest!.indexFor(MODEL)!;
      await waitUntil(() => index.overlaps(tokens, ["w-a"])[0]! >= blocks, 5000, "w-a indexed on GPU");
      // Churn w-a's 64-block GPU pool with other prompts until the first one is evicted there.
      for (let i = 0; i < 6; i++) await direct(sims[0]!, doc(`churn${i}-`, 100));
      const gpuOf = () => index.overlaps(tokens, ["w-a"])[0]!;
      const hostOf = () => index.tierOverlaps?.(tokens, ["w-a"])?.host[0] ?? 0;
      await waitUntil(
        () => gpuOf() < blocks / 2 && hostOf() >= blocks - (blocks % factor),
        5000,
        "evicted on GPU, kept on CPU",
      );

      const r = await fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: MODEL, prompt: `${p} and then?`, max_tokens: 1 }),
      });
      assert.equal(r.status, 200);
      const d = (
        (await (await fetch(`${server.url}/debug/decisions?model=${MODEL}&limit=1`)).json()) as {
          data: DecisionExplanationJson[];
        }
      ).data[0]!;
      const [a, b] = d.candidates;
      assert.equal(d.winner, "w-a", JSON.stringify(d.candidates));
      assert.ok(a!.scores["kv-prefix"]! < b!.scores["kv-prefix"]!, "the host copy lowers w-a's prefill cost");
    });
  });
}
