/**
 * Generators of realistic LLM traffic (issue #28 item 5), written as Mooncake-format JSONL traces.
 *
 *   node bench/fleet-routing/generate.ts --kind chat|agent|system|mix [--seed 1] [--sessions 200]
 *     [--duration-s 120] [--tenants 16] [--zipf 1.0] [--hot 0.5] [--preamble-blocks 1]
 *     [--think-s 2] [--window FROM,TO] [--out FILE.jsonl]
 *
 * Kinds (each seeded; none is fitted to a particular recorded trace):
 * - chat: multi-turn conversations. Each turn re-sends the whole history (system prompt, earlier
 *   user turns and answers) plus the previous answer and new user text. The next turn arrives
 *   after the previous answer's unloaded decode time plus a think time drawn short (exponential,
 *   mean --think-s), so under load it often arrives while the previous turn is still queued.
 * - agent: tool-using agents: many short steps, each appending a tool result and the model's call,
 *   with sub-second gaps: the context grows quickly and the next call follows at once.
 * - system: long shared system prompts (2k–8k tokens per tenant) with short one- to three-turn
 *   questions.
 * - mix: each session one of the above (chat 50 %, agent 25 %, system 25 %).
 * Every session belongs to a tenant drawn with Zipf popularity (exponent --zipf), or with tenant 0
 * taking --hot of the sessions; every prompt starts with a --preamble-blocks platform preamble
 * shared by all tenants, then the tenant's system prompt.
 *
 * Format: kvcache-ai/Mooncake FAST25-release/README.md @ 40ea55f8 and
 * FAST25-release/traces/conversation_trace.jsonl @ a2a4b18a: one object a line,
 * `{timestamp (ms from the trace start), input_length, output_length, hash_ids}`, one hash id per
 * 512-token block of the prompt (ceil(input_length / 512) ids; the last block may be partial).
 * A session is one token stream and block k of it has one id: a prompt is the stream's first
 * input_length tokens, so a turn's partial last block carries the id of the block the next turn
 * fills, and src/loadgen/workloads/trace.ts turns an id into the same text each time (a partial
 * block is its full block's first tokens): the next turn shares every token of the history, as
 * a re-sent conversation does. (Mooncake's own traces hash the block contents, so a partial
 * block there has an id of its own.) `group` names the tenant and session.
 *
 * Prints a sanity summary: requests, sessions, mean prompt and output, span, and the ideal reuse
 * (tokens of blocks whose id appeared in an earlier request, over all prompt tokens).
 */
import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Prng } from "../../src/loadgen/prng.ts";

export const MOONCAKE_BLOCK = 512;

export type TrafficKind = "chat" | "agent" | "system" | "mix";

export interface GenOptions {
  kind: TrafficKind;
  seed: number;
  /** Sessions (conversations, agent runs, question threads). */
  sessions: number;
  /** Session starts are Poisson over this many seconds. */
  durationS: number;
  tenants: number;
  /** Zipf exponent of tenant popularity (0: uniform). */
  zipf: number;
  /** When set, tenant 0 gets this share of the sessions and the others share the rest by Zipf. */
  hot?: number;
  /** 512-token blocks of a preamble every prompt starts with (all tenants). */
  preambleBlocks: number;
  /** Mean think time between a chat's answer and its next user turn, seconds. */
  thinkS: number;
  /** Longest prompt (tokens); a session ends before passing it. Default 32768 (the profile: 40960). */
  maxPrompt?: number;
  /**
   * Keep only the requests that arrive in [from, to) seconds, shifted to start at 0: a window of
   * traffic in steady state, whose first sessions began before it (their earlier turns are not
   * in the trace, as in any recorded window). Default: everything.
   */
  window?: [number, number];
}

export interface TraceLine {
  timestamp: number;
  input_length: number;
  output_length: number;
  hash_ids: number[];
  group: string;
}

/** Seconds per output token of an unloaded decode (the profile's ~14 ms step, rounded up). */
const DECODE_S = 0.02;

/** Log-uniform integer in [lo, hi]: heavy on short texts, with a long tail. */
function logUniform(rng: Prng, lo: number, hi: number): number {
  return Math.round(Math.exp(Math.log(lo) + rng.next() * (Math.log(hi) - Math.log(lo))));
}

function zipfPicker(n: number, s: number): (rng: Prng) => number {
  const w = Array.from({ length: n }, (_, i) => 1 / (i + 1) ** s);
  const total = w.reduce((a, b) => a + b, 0);
  const cdf: number[] = [];
  let acc = 0;
  for (const x of w) {
    acc += x / total;
    cdf.push(acc);
  }
  return (rng) => {
    const u = rng.next();
    const i = cdf.findIndex((c) => u < c);
    return i < 0 ? n - 1 : i;
  };
}

type SessionKind = Exclude<TrafficKind, "mix">;

/** One session's turns: appended tokens, output tokens, and the gap before the next turn. */
interface Turn {
  append: number;
  output: number;
  gapS: number;
}

function sessionTurns(kind: SessionKind, rng: Prng, thinkS: number): Turn[] {
  const turns: Turn[] = [];
  if (kind === "chat") {
    const n = 1 + Math.min(15, Math.floor(rng.exponential(1 / 4)));
    for (let t = 0; t < n; t++) {
      const output = logUniform(rng, 30, 800);
      turns.push({
        append: t === 0 ? logUniform(rng, 50, 3000) : logUniform(rng, 15, 600),
        output,
        gapS: output * DECODE_S + rng.exponential(1 / thinkS),
      });
    }
  } else if (kind === "agent") {
    const n = 4 + Math.floor(rng.exponential(1 / 8));
    for (let t = 0; t < Math.min(n, 40); t++) {
      const output = logUniform(rng, 20, 250);
      turns.push({
        // The task first; then each step's tool result (a file, a search page, a command's output).
        append: t === 0 ? logUniform(rng, 100, 1500) : logUniform(rng, 50, 3000),
        output,
        // The tool runs between the model's call and the next request: fast, sub-second mostly.
        gapS: output * DECODE_S + rng.exponential(1 / 0.4),
      });
    }
  } else {
    const n = 1 + Math.floor(rng.next() * 3);
    for (let t = 0; t < n; t++) {
      const output = logUniform(rng, 20, 400);
      turns.push({
        append: logUniform(rng, 20, 400),
        output,
        gapS: output * DECODE_S + rng.exponential(1 / thinkS),
      });
    }
  }
  return turns;
}

/** Tenant system prompts in whole blocks: short for chats, long for the "system" kind. */
function systemBlocks(kind: SessionKind, rng: Prng): number {
  return kind === "system" ? 4 + Math.floor(rng.next() * 13) : 1 + Math.floor(rng.next() * 3);
}

export function generate(o: GenOptions): TraceLine[] {
  const root = new Prng(o.seed).fork(`traffic-${o.kind}`);
  const arrivals = root.fork("arrivals");
  const pickRng = root.fork("tenants");
  const kinds = root.fork("kinds");
  const tenantRng = root.fork("tenant-prompts");
  const maxPrompt = o.maxPrompt ?? 32768;
  let nextId = 1;
  const fresh = (n: number) => Array.from({ length: n }, () => nextId++);
  const preamble = fresh(o.preambleBlocks);
  const zipf = zipfPicker(Math.max(1, o.tenants - (o.hot !== undefined ? 1 : 0)), o.zipf);
  const pickTenant = () => {
    if (o.hot === undefined || o.tenants < 2) return zipf(pickRng);
    return pickRng.next() < o.hot ? 0 : 1 + zipf(pickRng);
  };
  // Per tenant and session kind: its system prompt's blocks (fixed by the seed, drawn on first use).
  const systems = new Map<string, number[]>();
  const lines: TraceLine[] = [];
  const rate = o.sessions / o.durationS;
  let start = 0;
  for (let s = 0; s < o.sessions; s++) {
    start += arrivals.exponential(rate);
    const kind: SessionKind =
      o.kind !== "mix"
        ? o.kind
        : (["chat", "chat", "agent", "system"] as const)[Math.floor(kinds.next() * 4)];
    const tenant = pickTenant();
    const key = `${tenant}/${kind}`;
    let sys = systems.get(key);
    if (!sys) {
      sys = fresh(systemBlocks(kind, tenantRng));
      systems.set(key, sys);
    }
    // The session's stream: shared blocks first, then its own blocks, allocated as it grows.
    const stream = [...preamble, ...sys];
    let len = stream.length * MOONCAKE_BLOCK;
    let at = start;
    const rng = root.fork(`session-${s}`);
    for (const [t, turn] of sessionTurns(kind, rng, o.thinkS).entries()) {
      const input = len + turn.append;
      if (input > maxPrompt) break;
      const blocks = Math.ceil(input / MOONCAKE_BLOCK);
      while (stream.length < blocks) stream.push(nextId++);
      lines.push({
        timestamp: Math.round(at * 1000),
        input_length: input,
        output_length: turn.output,
        hash_ids: stream.slice(0, blocks),
        group: `tenant-${tenant}/${kind}-${s}/turn-${t}`,
      });
      // The answer joins the history the next turn re-sends.
      len = input + turn.output;
      at += turn.gapS;
    }
  }
  lines.sort((a, b) => a.timestamp - b.timestamp);
  if (!o.window) return lines;
  const [from, to] = o.window.map((x) => Math.round(x * 1000));
  return lines
    .filter((l) => l.timestamp >= from && l.timestamp < to)
    .map((l) => ({ ...l, timestamp: l.timestamp - from }));
}

export interface TraceSummary {
  requests: number;
  sessions: number;
  meanPrompt: number;
  meanOutput: number;
  spanS: number;
  /** Tokens of blocks whose id appeared in an earlier request (up to the length seen) / prompt tokens. */
  idealReuse: number;
}

/**
 * The trace's own ideal reuse at its block granularity: a block counts for the tokens of it an
 * earlier request already held (a partial block repeated as a longer one counts the shorter).
 */
export function summarize(lines: readonly Omit<TraceLine, "group">[]): TraceSummary {
  const seen = new Map<number, number>();
  let prompt = 0;
  let reused = 0;
  let output = 0;
  for (const l of lines) {
    prompt += l.input_length;
    output += l.output_length;
    l.hash_ids.forEach((h, k) => {
      const size = Math.min(MOONCAKE_BLOCK, l.input_length - k * MOONCAKE_BLOCK);
      const had = seen.get(h) ?? 0;
      reused += Math.min(had, size);
      if (size > had) seen.set(h, size);
    });
  }
  const groups = new Set(lines.map((l) => ("group" in l ? String(l.group).replace(/\/turn-\d+$/, "") : "")));
  const ts = lines.map((l) => l.timestamp);
  return {
    requests: lines.length,
    sessions: groups.size,
    meanPrompt: lines.length ? prompt / lines.length : 0,
    meanOutput: lines.length ? output / lines.length : 0,
    spanS: lines.length ? (Math.max(...ts) - Math.min(...ts)) / 1000 : 0,
    idealReuse: prompt ? reused / prompt : 0,
  };
}

export function formatSummary(name: string, s: TraceSummary): string {
  return `${name}: ${s.requests} requests in ${s.sessions} sessions over ${s.spanS.toFixed(0)} s; mean prompt ${s.meanPrompt.toFixed(0)} tokens, mean output ${s.meanOutput.toFixed(0)}; ideal reuse ${(100 * s.idealReuse).toFixed(1)}% of prompt tokens (512-token blocks)`;
}

export function toJsonl(lines: readonly TraceLine[]): string {
  return `${lines.map((l) => JSON.stringify(l)).join("\n")}\n`;
}

async function main(args: string[]): Promise<void> {
  const { exitWithUsageIfAsked } = await import("../usage.ts");
  exitWithUsageIfAsked(import.meta.url, args);
  const str = (name: string, def: string) => {
    const i = args.indexOf(`--${name}`);
    return i >= 0 ? args[i + 1] : def;
  };
  const kind = str("kind", "chat");
  if (!["chat", "agent", "system", "mix"].includes(kind))
    throw new Error(`--kind: chat, agent, system or mix`);
  const hot = str("hot", "");
  const o: GenOptions = {
    kind: kind as TrafficKind,
    seed: Number(str("seed", "1")),
    sessions: Number(str("sessions", "200")),
    durationS: Number(str("duration-s", "120")),
    tenants: Number(str("tenants", "16")),
    zipf: Number(str("zipf", "1")),
    hot: hot === "" ? undefined : Number(hot),
    preambleBlocks: Number(str("preamble-blocks", "1")),
    thinkS: Number(str("think-s", "2")),
  };
  const win = str("window", "");
  if (win !== "") o.window = win.split(",").map(Number) as [number, number];
  const lines = generate(o);
  const out = str("out", `${kind}-seed${o.seed}.jsonl`);
  writeFileSync(out, toJsonl(lines));
  console.log(formatSummary(out, summarize(lines)));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) await main(process.argv.slice(2));
