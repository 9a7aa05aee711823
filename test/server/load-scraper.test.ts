/**
 * LoadScraper against real HTTP `/metrics` endpoints (issue #16): gauge names chosen by the
 * worker record's engine kind, SGLang's PD backlog gauges and ATOM's parked KV loads counted
 * as waiting work, vLLM's current and older KV-usage names.
 */
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import type { EngineKind } from "../../src/discovery/types.ts";
import type { SharedLoad } from "../../src/router/peers/types.ts";
import { WorkerSet } from "../../src/router/worker-set.ts";
import { LoadScraper, parseEngineLoad } from "../../src/server/load-scraper.ts";
import { createLogger } from "../../src/util/log.ts";
import { mixedRecord } from "../helpers/records.ts";
import { waitUntil } from "../helpers/wait.ts";

const logger = createLogger("test", {});
logger.level = "silent";

// sgl-project/sglang python/sglang/srt/metrics/collector.py @ 93d04878cfb9b08645fae7b11bd340ee33b34acf:
// SchedulerMetricsCollector's gauges, labelled with the scheduler's labels (model_name,
// engine_type, tp_rank, ...): num_running_reqs, num_queue_reqs, token_usage and, for PD,
// num_prefill_prealloc_queue_reqs, num_prefill_inflight_queue_reqs,
// num_decode_prealloc_queue_reqs, num_decode_transfer_queue_reqs.
const SGLANG_DECODE = [
  "# TYPE sglang:num_running_reqs gauge",
  'sglang:num_running_reqs{model_name="m",engine_type="decode",tp_rank="0"} 3.0',
  'sglang:num_queue_reqs{model_name="m",engine_type="decode",tp_rank="0"} 1.0',
  'sglang:token_usage{model_name="m",engine_type="decode",tp_rank="0"} 0.5',
  'sglang:num_decode_prealloc_queue_reqs{model_name="m",engine_type="decode",tp_rank="0"} 4.0',
  'sglang:num_decode_transfer_queue_reqs{model_name="m",engine_type="decode",tp_rank="0"} 6.0',
  'sglang:num_prefill_prealloc_queue_reqs{model_name="m",engine_type="decode",tp_rank="0"} 0.0',
  'sglang:num_prefill_inflight_queue_reqs{model_name="m",engine_type="decode",tp_rank="0"} 0.0',
  // Not a load gauge:
  'sglang:num_bootstrap_failed_reqs_total{model_name="m"} 9.0',
].join("\n");

// vllm-project/vllm vllm/v1/metrics/loggers.py @ a6f0308cfe806b7731ad4979c9bea6e470c35efd:
// vllm:num_requests_running / _waiting and vllm:kv_cache_usage_perc per engine. A vLLM
// worker's page that also carries other engines' names (a sidecar, a proxy in front) must not
// mix them in.
const VLLM_WITH_NOISE = [
  'vllm:num_requests_running{model_name="m",engine="0"} 2',
  'vllm:num_requests_waiting{model_name="m",engine="0"} 1',
  'vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.25',
  'vllm:gpu_cache_usage_perc{model_name="m",engine="0"} 0.25',
  "sglang:num_running_reqs 50",
  "atom:requests_waiting 70",
].join("\n");

// ROCm/ATOM atom/entrypoints/openai/metrics.py @ ffdf3bb5ddf8a15a64d521a2eeb3bc7438f9ac21.
const ATOM = [
  "atom:requests_running 2.0",
  "atom:requests_waiting 1.0",
  "atom:requests_parked_kv_load 5.0",
  "atom:kv_cache_usage_ratio 0.75",
].join("\n");

const pages: Record<string, string> = { sglang: SGLANG_DECODE, vllm: VLLM_WITH_NOISE, atom: ATOM };
let server: Server;
let base = "";
before(async () => {
  server = createServer((req, res) => {
    const page = pages[(req.url ?? "").split("/")[1] ?? ""];
    if (!page || !req.url?.endsWith("/metrics")) {
      res.statusCode = 404;
      res.end();
      return;
    }
    res.setHeader("content-type", "text/plain; version=0.0.4");
    res.end(page);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
after(() => new Promise<void>((r) => server.close(() => r())));

async function scrape(engine: EngineKind) {
  const rec = mixedRecord({ id: engine, model: "m", url: `${base}/${engine}`, engine, role: "decode" });
  const ws = new WorkerSet(new MemoryDiscovery([rec]), { logger });
  ws.attach();
  await new LoadScraper(ws, 60_000).scrapeAll();
  const load = ws.get(engine)?.engineLoad;
  await ws.close();
  return load;
}

describe("LoadScraper reads each engine's own gauges (issue #16)", () => {
  it("SGLang: the PD backlog queues count as waiting work", async () => {
    const l = await scrape("sglang");
    assert.ok(l);
    assert.equal(l.running, 3);
    assert.equal(l.waiting, 1 + 4 + 6, "queue + decode prealloc + decode transfer");
    assert.equal(l.pdBacklog, 10);
    assert.equal(l.kvUsage, 0.5);
  });

  it("vLLM: only vLLM's names, old and new KV usage counted once", async () => {
    const l = await scrape("vllm");
    assert.ok(l);
    assert.deepEqual([l.running, l.waiting, l.kvUsage], [2, 1, 0.25]);
  });

  it("ATOM: parked KV loads count as waiting work", async () => {
    const l = await scrape("atom");
    assert.ok(l);
    assert.deepEqual([l.running, l.waiting, l.kvUsage], [2, 6, 0.75]);
  });
});

describe("parseEngineLoad", () => {
  it("reads vLLM (summing engines), SGLang and ATOM gauges", () => {
    const vllm = [
      "# HELP vllm:num_requests_running x",
      'vllm:num_requests_running{model_name="m",engine="0"} 3',
      'vllm:num_requests_running{model_name="m",engine="1"} 2',
      'vllm:num_requests_waiting{model_name="m",engine="0"} 4',
      'vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.5',
      'vllm:kv_cache_usage_perc{model_name="m",engine="1"} 0.25',
      'vllm:num_requests_running_other{model_name="m"} 99',
    ].join("\n");
    const v = parseEngineLoad(vllm, 1)!;
    assert.deepEqual(v, { running: 5, waiting: 4, kvUsage: 0.375, scrapedAt: 1 });
    const s = parseEngineLoad(
      'sglang:num_running_reqs{tp_rank="0"} 1.0\nsglang:num_queue_reqs 2\nsglang:token_usage 0.1\n',
      2,
    )!;
    assert.deepEqual(s, { running: 1, waiting: 2, kvUsage: 0.1, scrapedAt: 2 });
    const a = parseEngineLoad(
      "atom:requests_running 6\natom:requests_waiting 0\natom:kv_cache_usage_ratio 0.9 1700000000\n",
      3,
    )!;
    assert.deepEqual(a, { running: 6, waiting: 0, kvUsage: 0.9, scrapedAt: 3 });
    assert.equal(parseEngineLoad("other_metric 1\n"), null);
  });
});

describe("LoadScraper scrapes adaptively (issue #32)", () => {
  // vLLM's gauge names (vllm/v1/metrics/loggers.py @ a6f0308, as above); a page that can change.
  it("an idle, unchanged worker is scraped at the idle pace; a busy or changing one at the fast pace", async () => {
    const hits: Record<string, number> = { idle: 0, busy: 0, routed: 0 };
    const page = (running: number) =>
      [
        `vllm:num_requests_running{model_name="m",engine="0"} ${running}`,
        'vllm:num_requests_waiting{model_name="m",engine="0"} 0',
        'vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0',
      ].join("\n");
    const srv = createServer((req, res) => {
      const id = (req.url ?? "").split("/")[1] ?? "";
      hits[id] = (hits[id] ?? 0) + 1;
      res.end(page(id === "busy" ? 1 : 0));
    });
    await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
    const recs = ["idle", "busy", "routed"].map((id) =>
      mixedRecord({ id, model: "m", url: `${url}/${id}`, engine: "vllm" }),
    );
    const ws = new WorkerSet(new MemoryDiscovery(recs), { logger });
    ws.attach();
    // Fast pace 50 ms, idle pace 10 s: by the time a busy worker has been scraped 8 times (~0.4 s)
    // an idle one has been scraped twice (the first scrape, and the second that sees the same idle
    // load). Counted against each other, not against a fixed sleep: on a loaded box a 1 s sleep
    // saw no busy scrape at all.
    const scraper = new LoadScraper(ws, 50, 10_000);
    // Flow control re-checks its queue after every round, not only the first (a merge had
    // dropped the call from the periodic rounds).
    let rounds = 0;
    scraper.onScraped = () => rounds++;
    scraper.start();
    // This server has a request in flight on "routed" (idle by its gauges): it stays fast.
    ws.get("routed")!.inFlight = 1;
    // Well under the idle pace when the box is not crawling; an idle third scrape is allowed.
    await waitUntil(() => hits.busy >= 8 && hits.routed >= 8, 8000, "8 fast-paced scrapes").catch(() => {});
    scraper.stop();
    ws.get("routed")!.inFlight = 0;
    await ws.close();
    await new Promise<void>((r) => srv.close(() => r()));
    assert.ok(
      hits.idle <= 3,
      `idle worker scraped ${hits.idle} times (idle pace 10 s) while busy had ${hits.busy}`,
    );
    assert.ok(hits.busy >= 8, `busy worker scraped ${hits.busy} times (fast pace 50 ms)`);
    assert.ok(hits.routed >= 8, `worker with requests in flight scraped ${hits.routed} times`);
    assert.ok(rounds >= 8, `onScraped called after ${rounds} rounds in 1 s`);
  });
});

describe("LoadScraper shares its scrapes with peers (issue #32)", () => {
  // The peer side (ownership, the wire) is test/router/peers/load-share.test.ts; here the
  // scraper's side against a stand-in SharedLoad: which workers it scrapes, what it reports.
  it("scrapes only what it owns, files peers' readings, and scrapes a worker whose owner fell silent", async () => {
    const hits: Record<string, number> = {};
    const srv = createServer((req, res) => {
      const id = (req.url ?? "").split("/")[1] ?? "";
      hits[id] = (hits[id] ?? 0) + 1;
      res.end(
        'vllm:num_requests_running{engine="0"} 1\nvllm:num_requests_waiting{engine="0"} 2\nvllm:kv_cache_usage_perc{engine="0"} 0.5\n',
      );
    });
    await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
    const recs = ["mine", "peers", "silent"].map((id) =>
      mixedRecord({ id, model: "m", url: `${url}/${id}`, engine: "vllm" }),
    );
    const ws = new WorkerSet(new MemoryDiscovery(recs), { logger });
    ws.attach();
    const reports: { readings: string[]; busy: string[] }[] = [];
    const share: SharedLoad = {
      replicaId: "me",
      isMine: (id) => id === "mine",
      busyElsewhere: () => false,
      liveCount: () => 2,
      report: (readings, busy) => reports.push({ readings: readings.map((r) => r.worker), busy: [...busy] }),
      leave: () => {
        left++;
      },
      onReadings: null,
    };
    let left = 0;
    // Fast pace 50 ms, idle pace 200 ms: a peer's worker counts as silent after 1.25 × 200 + 2 × 50 ms.
    const scraper = new LoadScraper(ws, 50, 200);
    scraper.shareWith(share);
    assert.equal(scraper.idleQuietMs, 350);
    ws.get("peers")!.inFlight = 1;
    scraper.start();
    // The owner of "peers" reports it every 50 ms; nobody reports "silent".
    const owner = setInterval(() => {
      share.onReadings?.([
        { worker: "peers", running: 4, waiting: 0, kvUsage: 0.1, scrapedAt: Date.now() - 5 },
      ]);
    }, 50);
    await new Promise((r) => setTimeout(r, 250));
    const early = { ...hits };
    // Silent from ~400 ms on (its first tick + 350 ms); room for a loaded box's late timers.
    await new Promise((r) => setTimeout(r, 750));
    clearInterval(owner);
    scraper.stop();
    assert.equal(left, 1, "stopping says goodbye (peers take its workers over at once)");
    await ws.close();
    await new Promise<void>((r) => srv.close(() => r()));
    // start() scrapes everything once; then only its own and, once silent, the silent one.
    assert.equal(early.peers, 1, "a peer's worker is not scraped while its readings come");
    assert.equal(early.silent, 1, "nor a silent one before the quiet time");
    assert.ok(hits.mine >= 5, `own worker scraped ${hits.mine} times`);
    assert.equal(hits.peers, 1, "still not after");
    assert.ok(hits.silent >= 2, `the silent worker scraped here again: ${hits.silent}`);
    assert.equal(ws.get("peers")!.engineLoad?.running, 4, "the peer's reading is the worker's load");
    assert.ok(scraper.peerReadings >= 5);
    // Every tick reports (the heartbeat) with the busy hint; scraped readings go out too.
    assert.ok(reports.length >= 5, `${reports.length} reports`);
    assert.ok(
      reports.some((r) => r.busy.includes("peers")),
      "busy hint for the peer's worker",
    );
    assert.ok(
      reports.every((r) => !r.busy.includes("mine")),
      "no hint for its own",
    );
    assert.ok(reports.some((r) => r.readings.includes("mine")));
  });
});
