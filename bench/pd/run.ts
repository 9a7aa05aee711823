/**
 * PD benchmark: the same long-prompt workload on two sims, run as 2 × mixed workers and as
 * 1P1D (one prefill + one decode worker, Nixl side channel), both behind `infera server`,
 * in one run. Prints TTFT and inter-token latency p50/p99 side by side with their ratios,
 * and what the simulator's timing model predicts for each, and why.
 *
 *   node bench/pd/run.ts [--rate 6] [--duration 20] [--prompt-min 2000]
 *       [--prompt-max 4000] [--output 128] [--speed 1] [--connector nixl] [--seed 7]
 *
 * Open loop: Poisson arrivals at `rate` req/s for `duration` s, the same seeded schedule
 * and prompts for both set-ups; every prompt starts with a unique tag so no prefix cache
 * helps either side. Streaming completions; TTFT = first text chunk, ITL = gaps after it.
 */
import { cpus, loadavg } from "node:os";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { completeRecord } from "../../src/discovery/static.ts";
import type { WorkerRecord } from "../../src/discovery/types.ts";
import { loadProfile, stepSeconds } from "../../src/engine/sim/profile.ts";
import { startServer } from "../../src/server/index.ts";
import { getDefaultTokenizer } from "../../src/tokenizer/tokenizer.ts";
import { freePort } from "../../test/helpers/ports.ts";
import { type SimProcess, startSim } from "../../test/helpers/sim.ts";
import { pairedArgs } from "../usage.ts";

const args = pairedArgs(process.argv.slice(2));
const RATE = Number(args.get("rate") ?? 6);
const DURATION_S = Number(args.get("duration") ?? 20);
const PROMPT_MIN = Number(args.get("prompt-min") ?? 2000);
const PROMPT_MAX = Number(args.get("prompt-max") ?? 4000);
const OUTPUT = Number(args.get("output") ?? 128);
const SPEED = Number(args.get("speed") ?? 1);
const CONNECTOR = args.get("connector") ?? "nixl";
const SEED = Number(args.get("seed") ?? 7);
/** Cap on the bytes one KV pull moves (the sim's default is 8 MiB; the real KV is ~2 MiB/block). */
const TRANSFER_CAP_MIB = Number(args.get("transfer-cap-mib") ?? 8);
const MODEL = "sim-model";

/** mulberry32: a small seeded PRNG so both set-ups see the same workload. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface Job {
  at: number;
  prompt: string;
  tokens: number;
}

const WORDS =
  "cache block prefill decode worker router token stream batch latency tensor kernel memory bandwidth transfer pull handshake notify bootstrap engine schedule queue page hash prefix radix shard replica lease watch event replay metric gauge counter histogram throughput quantile".split(
    " ",
  );

function workload(): Job[] {
  const r = rng(SEED);
  const tok = getDefaultTokenizer();
  const jobs: Job[] = [];
  let t = 0;
  for (let i = 0; ; i++) {
    t += -Math.log(1 - r()) / RATE;
    if (t >= DURATION_S) break;
    const target = Math.round(PROMPT_MIN + r() * (PROMPT_MAX - PROMPT_MIN));
    const words: string[] = [`[job ${i} ${Math.floor(r() * 1e9)}]`];
    // Roughly one token per word with this vocabulary; trimmed to the target below.
    for (let w = 0; w < target; w++) words.push(WORDS[Math.floor(r() * WORDS.length)]!);
    let ids = tok.encode(words.join(" "));
    if (ids.length > target) ids = ids.slice(0, target);
    jobs.push({ at: t, prompt: tok.decode(ids), tokens: ids.length });
  }
  return jobs;
}

interface Sample {
  ttft: number;
  itl: number[];
  ok: boolean;
}

async function runOne(url: string, job: Job): Promise<Sample> {
  const t0 = performance.now();
  const itl: number[] = [];
  let first = 0;
  let last = 0;
  try {
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: MODEL,
        prompt: job.prompt,
        max_tokens: OUTPUT,
        stream: true,
        ignore_eos: true,
      }),
    });
    if (res.status !== 200 || !res.body) {
      await res.text();
      return { ttft: 0, itl, ok: false };
    }
    const dec = new TextDecoder();
    let buf = "";
    for await (const chunk of res.body as AsyncIterable<Uint8Array>) {
      buf += dec.decode(chunk, { stream: true });
      let nl = buf.indexOf("\n\n");
      while (nl >= 0) {
        const ev = buf.slice(0, nl);
        buf = buf.slice(nl + 2);
        nl = buf.indexOf("\n\n");
        if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
        const j = JSON.parse(ev.slice(6)) as { choices?: Array<{ text?: string }> };
        if (!j.choices?.[0]?.text) continue;
        const now = performance.now();
        if (first === 0) first = now;
        else itl.push(now - last);
        last = now;
      }
    }
    return { ttft: first - t0, itl, ok: first > 0 };
  } catch {
    return { ttft: 0, itl, ok: false };
  }
}

function pct(xs: number[], q: number): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
}

interface Result {
  name: string;
  ttft50: number;
  ttft99: number;
  itl50: number;
  itl99: number;
  ok: number;
  failed: number;
  tokPerS: number;
  pulledTokens: number;
}

async function promptSource(sim: SimProcess, source: string): Promise<number> {
  const m = await sim.metrics();
  let total = 0;
  for (const line of m.split("\n")) {
    if (line.startsWith("vllm:prompt_tokens_by_source_total{") && line.includes(`source="${source}"`)) {
      total += Number(line.slice(line.lastIndexOf(" ") + 1));
    }
  }
  return total;
}

async function phase(name: string, pd: boolean, jobs: Job[]): Promise<Result> {
  const sims: SimProcess[] = [];
  const records: WorkerRecord[] = [];
  const common = ["--speed", String(SPEED), "--max-model-len", "16384"];
  if (!pd) {
    for (let i = 0; i < 2; i++) {
      const s = await startSim({
        model: MODEL,
        args: [...common, "--seed", String(i + 1)],
        timeoutMs: 60_000,
      });
      sims.push(s);
      records.push(
        completeRecord({
          id: `mixed-${i}`,
          url: s.url,
          model: MODEL,
          servedModelNames: [MODEL],
          engine: "sim",
          role: "mixed",
        }),
      );
    }
  } else {
    for (const role of ["prefill", "decode"] as const) {
      const port = await freePort();
      const cfg = {
        kv_connector: CONNECTOR,
        kv_role: "kv_both",
        kv_connector_extra_config: { side_channel_port: port },
      };
      const s = await startSim({
        model: MODEL,
        args: [
          ...common,
          "--role",
          role,
          "--connector",
          CONNECTOR,
          "--kv-transfer-config",
          JSON.stringify(cfg),
        ],
        timeoutMs: 60_000,
      });
      sims.push(s);
      records.push(
        completeRecord({
          id: role,
          url: s.url,
          model: MODEL,
          servedModelNames: [MODEL],
          engine: "sim",
          role,
          connector: { kind: CONNECTOR as "nixl", bootstrapHost: "127.0.0.1", bootstrapPort: port },
        }),
      );
    }
  }
  const server = await startServer(
    { port: 0, scrapeIntervalMs: 0, policy: "round-robin" },
    { discovery: new MemoryDiscovery(records) },
  );
  try {
    // Warm-up: connections, tokenizer, JIT; not measured.
    await Promise.all(
      [0, 1].map((i) => runOne(server.url, { at: 0, prompt: `[warm ${i}] hello`, tokens: 3 })),
    );
    const start = performance.now();
    const samples = await Promise.all(
      jobs.map(async (job) => {
        const wait = start + job.at * 1000 - performance.now();
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        return runOne(server.url, job);
      }),
    );
    const wall = (performance.now() - start) / 1000;
    const ok = samples.filter((s) => s.ok);
    const pulled = pd ? await promptSource(sims[1]!, "external_kv_transfer") : 0;
    return {
      name,
      ttft50: pct(
        ok.map((s) => s.ttft),
        0.5,
      ),
      ttft99: pct(
        ok.map((s) => s.ttft),
        0.99,
      ),
      itl50: pct(
        ok.flatMap((s) => s.itl),
        0.5,
      ),
      itl99: pct(
        ok.flatMap((s) => s.itl),
        0.99,
      ),
      ok: ok.length,
      failed: samples.length - ok.length,
      tokPerS: (ok.length * OUTPUT) / wall,
      pulledTokens: pulled,
    };
  } finally {
    await server.close();
    await Promise.all(sims.map((s) => s.stop()));
  }
}

function predictions(meanPrompt: number): string[] {
  const p = loadProfile();
  const prefill = (L: number) =>
    stepSeconds(p, { prefillTokens: L, prefillTokenCtx: L * L, decodeSeqs: 0, decodeKvTokens: 0 });
  // Requests decoding at once: arrival rate × time in decode (OUTPUT steps of a few ms).
  const decodeStep = (n: number, ctx: number) =>
    stepSeconds(p, { prefillTokens: 0, prefillTokenCtx: 0, decodeSeqs: n, decodeKvTokens: n * ctx });
  const ctx = meanPrompt + OUTPUT / 2;
  let n = Math.max(1, RATE * OUTPUT * decodeStep(1, ctx));
  for (let i = 0; i < 5; i++) n = Math.max(1, RATE * OUTPUT * decodeStep(n, ctx));
  const tPre = prefill(meanPrompt);
  const tDec = decodeStep(n, ctx);
  const tDecMixed = decodeStep(n / 2, ctx);
  // One P serves every prefill: M/D/1 wait ρ/(2μ(1−ρ)); two mixed workers split them.
  const md1 = (lambda: number, s: number) => {
    const rho = lambda * s;
    return rho >= 1 ? Number.POSITIVE_INFINITY : (rho * s) / (2 * (1 - rho));
  };
  const mixedTtft = tPre + tDecMixed * 0 + md1(RATE / 2, tPre + tDecMixed);
  const pdTtft = tPre + md1(RATE, tPre) + tDec;
  // Share of a mixed worker's steps (= of its decode gaps) that carry a prefill: λ/2 prefill
  // steps per second against the decode steps that fit in the rest of each second.
  const busy = (RATE / 2) * (tPre + tDecMixed);
  const prefillShare = RATE / 2 / (RATE / 2 + Math.max(0, 1 - busy) / tDecMixed);
  const ms = (s: number) => `${(s * 1000).toFixed(1)} ms`;
  return [
    `profile ${p.name}: prefill of a ${Math.round(meanPrompt)}-token prompt = ${ms(tPre)} (overhead + ${p.prefill_per_token_s * 1e6} us/token + attention ${p.attention_per_token_ctx_s}·L²);`,
    `  a decode step with ~${n.toFixed(1)} sequences at ~${Math.round(ctx)} tokens of context = ${ms(tDec)} (1P1D's D) / ${ms(tDecMixed)} (each mixed worker, half the batch).`,
    `2×mixed: ITL p50 ≈ a pure decode step (${ms(tDecMixed)}); ITL p99 ≈ a decode step that also carries a whole prefill (${ms(tPre + tDecMixed)}),`,
    `  because ~${(prefillShare * 100).toFixed(1)}% of a mixed worker's steps include a new prompt (the chunked-prefill budget of ${p.max_num_batched_tokens} tokens/step exceeds the prompt, so one step takes it all)${prefillShare > 0.01 ? ", more than 1%" : "; that is under 1%, so p99 sits just below the prefill steps and p99.9 on them"}.`,
    `  TTFT ≈ prefill + M/D/1 queueing on two workers at λ/2 = ${RATE / 2}/s: ${ms(mixedTtft)}.`,
    `1P1D: D's steps never carry a prefill (it imports P's KV and computes ≤ 1 block's tail), so ITL p50 ≈ p99 ≈ ${ms(tDec)}.`,
    `  TTFT ≈ prefill + M/D/1 queueing on ONE P at λ = ${RATE}/s (ρ = ${(RATE * tPre).toFixed(2)}) + the KV pull + D's first step: ${ms(pdTtft)} + transfer.`,
    `So PD should cut ITL p99 by ~${((tPre + tDecMixed) / tDec).toFixed(0)}× and cost some TTFT (one prefill worker instead of two, plus the hop and the pull).`,
  ];
}

const jobs = workload();
const meanPrompt = jobs.reduce((a, j) => a + j.tokens, 0) / Math.max(1, jobs.length);
console.log(
  `PD bench: ${jobs.length} requests, Poisson ${RATE}/s for ${DURATION_S}s, prompts ${PROMPT_MIN}-${PROMPT_MAX} tokens (mean ${Math.round(meanPrompt)}), ${OUTPUT} output tokens, --speed ${SPEED}, connector ${CONNECTOR}, KV pull capped at ${TRANSFER_CAP_MIB} MiB`,
);
console.log(
  `machine: ${cpus().length} cores, load average ${loadavg()
    .map((x) => x.toFixed(1))
    .join(" ")}`,
);
const results: Result[] = [];
results.push(await phase("2 × mixed", false, jobs));
results.push(await phase(`1P1D (${CONNECTOR})`, true, jobs));

const f = (x: number) => (Number.isFinite(x) ? x.toFixed(1).padStart(9) : "      n/a");
console.log("");
console.log("set-up            TTFT p50  TTFT p99   ITL p50   ITL p99   tok/s   ok/failed  D pulled tokens");
for (const r of results) {
  console.log(
    `${r.name.padEnd(16)} ${f(r.ttft50)} ${f(r.ttft99)} ${f(r.itl50)} ${f(r.itl99)} ${r.tokPerS.toFixed(0).padStart(7)}   ${String(r.ok).padStart(3)}/${r.failed}     ${r.pulledTokens}`,
  );
}
const [m, d] = results as [Result, Result];
console.log(
  `ratio 1P1D/mixed  ${f(d.ttft50 / m.ttft50)} ${f(d.ttft99 / m.ttft99)} ${f(d.itl50 / m.itl50)} ${f(d.itl99 / m.itl99)}   (ms above; ratios here)`,
);
console.log("");
console.log("What the timing model predicts:");
for (const line of predictions(meanPrompt)) console.log(`  ${line}`);
process.exit(0);
