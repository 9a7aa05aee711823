import type { Command } from "commander";
import { envVar } from "../config/env-table.ts";
import { refuseArgvSecrets } from "./argv-secrets.ts";

interface BenchCliOptions {
  url?: string;
  model?: string;
  workload: string;
  rate?: string;
  timeScale?: string;
  concurrency?: string;
  requests: string;
  seed: string;
  stream: boolean;
  maxTokens?: string;
  endpoint: string;
  apiKey?: string;
  sloTtftMs?: string;
  sloItlMs?: string;
  sloE2eMs?: string;
  output?: string;
  plot?: string;
  duration?: string;
  timeout: string;
  inputLen?: string;
  outputLen?: string;
  documents?: string;
  docLen?: string;
  systemPrompts?: string;
  systemLen?: string;
  turns?: string;
  replies: string;
  ignoreEos?: boolean;
  label?: string;
  quiet?: boolean;
  compare?: string[];
}

class CliError extends Error {}

function num(
  name: string,
  v: string | undefined,
  opts: { int?: boolean; min?: number } = {},
): number | undefined {
  if (v === undefined) return undefined;
  if (v === "inf") return Number.POSITIVE_INFINITY;
  const n = Number(v);
  if (!Number.isFinite(n) || (opts.int && !Number.isInteger(n)) || n < (opts.min ?? 0)) {
    throw new CliError(
      `--${name}: expected a ${opts.int ? "whole " : ""}number >= ${opts.min ?? 0}, got "${v}"`,
    );
  }
  return n;
}

function range(name: string, v: string | undefined): [number, number] | undefined {
  if (v === undefined) return undefined;
  const m = /^(\d+)(?:[:-](\d+))?$/.exec(v);
  if (!m) throw new CliError(`--${name}: expected N or MIN:MAX, got "${v}"`);
  const lo = Number(m[1]);
  const hi = m[2] !== undefined ? Number(m[2]) : lo;
  if (hi < lo) throw new CliError(`--${name}: MAX < MIN`);
  return [lo, hi];
}

/** --time-scale F: a finite number > 0 (F = 2 replays the trace twice as fast). */
function timeScale(v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const f = Number(v);
  if (!(Number.isFinite(f) && f > 0)) throw new CliError(`--time-scale: expected a number > 0, got "${v}"`);
  return f;
}

async function runCompare(files: string[]): Promise<void> {
  if (files.length !== 2) throw new CliError("--compare takes exactly two result files");
  const { readFileSync } = await import("node:fs");
  const { parseResult, formatCompare } = await import("../loadgen/index.ts");
  const [fa, fb] = files;
  const load = (f: string) => {
    try {
      return parseResult(readFileSync(f, "utf8"), f);
    } catch (e) {
      throw new CliError(`${f}: ${(e as Error).message}`);
    }
  };
  const a = load(fa);
  const b = load(fb);
  process.stdout.write(`${formatCompare(a, b, fa, fb)}\n`);
}

async function runCli(o: BenchCliOptions): Promise<void> {
  if (o.compare) return runCompare(o.compare);
  if (!o.url) throw new CliError("--url is required (or use --compare a.json b.json)");
  if (!o.model) throw new CliError("--model is required");
  if (o.rate === undefined && o.concurrency === undefined && !o.workload.endsWith(".jsonl")) {
    throw new CliError(
      "give --rate R (Poisson arrivals, req/s; 'inf' = all at once) or --concurrency C, or both",
    );
  }
  if (o.plot && !o.plot.endsWith(".html"))
    throw new CliError("--plot writes a self-contained .html file (PNG is not built)");
  if (o.endpoint !== "chat" && o.endpoint !== "completions")
    throw new CliError("--endpoint: chat or completions");
  if (o.replies !== "standin" && o.replies !== "actual") throw new CliError("--replies: standin or actual");
  const { writeFileSync } = await import("node:fs");
  const bench = await import("../loadgen/index.ts");
  const spec = bench.parseWorkloadName(o.workload);
  if (spec.kind === "synthetic") {
    spec.inputLen = range("input-len", o.inputLen);
    spec.outputLen = range("output-len", o.outputLen);
  } else if (spec.kind === "doc-qa") {
    spec.documents = num("documents", o.documents, { int: true, min: 1 });
    spec.docLen = num("doc-len", o.docLen, { int: true, min: 1 });
  } else if (spec.kind === "multi-turn") {
    spec.systemPrompts = num("system-prompts", o.systemPrompts, { int: true, min: 1 });
    spec.systemLen = num("system-len", o.systemLen, { int: true });
    spec.turns = num("turns", o.turns, { int: true, min: 1 });
    spec.replies = o.replies;
  }
  const progress = o.quiet ? null : bench.createProgress(process.stderr);
  const ac = new AbortController();
  const onSigint = () => ac.abort();
  process.once("SIGINT", onSigint);
  const durationS = num("duration", o.duration);
  const result = await bench.runBench({
    url: o.url,
    model: o.model,
    workload: spec,
    requests: num("requests", o.requests, { int: true, min: 1 }),
    seed: num("seed", o.seed, { int: true }),
    rate: num("rate", o.rate),
    timeScale: timeScale(o.timeScale),
    concurrency: num("concurrency", o.concurrency, { int: true, min: 1 }),
    stream: o.stream,
    maxTokens: num("max-tokens", o.maxTokens, { int: true, min: 1 }),
    endpoint: o.endpoint,
    apiKey: o.apiKey ?? envVar("INFERA_API_KEY"),
    slo: {
      ttft_ms: num("slo-ttft-ms", o.sloTtftMs),
      itl_ms: num("slo-itl-ms", o.sloItlMs),
      e2e_ms: num("slo-e2e-ms", o.sloE2eMs),
    },
    timeoutMs: (num("timeout", o.timeout) ?? 60) * 1000,
    durationS: durationS !== undefined && Number.isFinite(durationS) ? durationS : undefined,
    ignoreEos: o.ignoreEos,
    label: o.label,
    onProgress: progress ? (p) => progress.update(p) : undefined,
    signal: ac.signal,
  });
  process.off("SIGINT", onSigint);
  progress?.finish();
  // Drop the SLO keys that were not given, so the JSON holds only what was asked.
  for (const k of ["ttft_ms", "itl_ms", "e2e_ms"] as const)
    if (result.config.slo[k] === undefined) delete result.config.slo[k];
  process.stdout.write(`${bench.formatTable(result)}\n`);
  if (o.output) {
    writeFileSync(o.output, `${JSON.stringify(result, null, 2)}\n`);
    process.stderr.write(`bench: results written to ${o.output}\n`);
  }
  if (o.plot) {
    writeFileSync(o.plot, bench.renderPlotHtml(result));
    process.stderr.write(`bench: plot written to ${o.plot}\n`);
  }
}

export function registerBench(program: Command): void {
  const cmd = program
    .command("bench")
    .description(
      "Load generator for an OpenAI-compatible server or engine: TTFT, ITL, throughput, goodput, cache hits",
    )
    .option("--url <url>", "base URL of the server or engine (http://host:port)")
    .option("--model <name>", "model name sent in each request")
    .option("--workload <name>", "synthetic | multi-turn | doc-qa | FILE.jsonl (a trace)", "synthetic")
    .option("--rate <r>", "Poisson arrivals at R requests/s ('inf': all at once)")
    .option(
      "--time-scale <f>",
      "replay a trace's arrivals F times faster, keeping its own gaps (2 halves every gap)",
    )
    .option("--concurrency <c>", "at most C requests in flight (closed loop without --rate)")
    .option("--requests <n>", "number of requests", "100")
    .option("--seed <s>", "seed of the workload and the arrival times", "0")
    .option("--stream", "stream the answers (default; needed for TTFT and ITL)", true)
    .option("--no-stream", "ask for whole answers (TTFT = e2e)")
    .option("--max-tokens <k>", "fixed max_tokens for every request (default: the workload's)")
    .option("--endpoint <e>", "chat (/v1/chat/completions) or completions (/v1/completions)", "chat")
    .option("--api-key <key>", "refused (argv is public): the bearer token it sends in INFERA_API_KEY")
    .option("--slo-ttft-ms <x>", "goodput SLO: time to first token")
    .option("--slo-itl-ms <y>", "goodput SLO: a request's mean inter-token latency")
    .option("--slo-e2e-ms <z>", "goodput SLO: end-to-end latency")
    .option("--output <file>", "write the results as JSON (schema_version 1)")
    .option("--plot <file.html>", "write latency CDFs and throughput over time as a self-contained HTML file")
    .option("--duration <s>", "stop sending new requests after S seconds")
    .option("--timeout <s>", "per-request timeout in seconds", "60")
    .option("--input-len <min:max>", "synthetic: prompt length range in tokens")
    .option("--output-len <min:max>", "synthetic: output length range when --max-tokens is not set")
    .option("--documents <k>", "doc-qa: number of documents")
    .option("--doc-len <n>", "doc-qa: document length in tokens")
    .option("--system-prompts <n>", "multi-turn: number of shared system prompts")
    .option("--system-len <n>", "multi-turn: system prompt length in tokens")
    .option("--turns <n>", "multi-turn: turns per conversation")
    .option(
      "--replies <mode>",
      "multi-turn history: standin (deterministic) or actual (server replies)",
      "standin",
    )
    .option("--ignore-eos", "send ignore_eos: true so every request generates max_tokens (vLLM)")
    .option("--label <text>", "label stored in the results (shown by --compare)")
    .option("--quiet", "no progress output")
    .option("--compare <files...>", "print two result files side by side with ratios")
    .action(async (o: BenchCliOptions) => {
      try {
        await runCli(o);
      } catch (e) {
        const err = e as Error & { status?: number };
        if (
          e instanceof CliError ||
          err.status === 400 ||
          (e as NodeJS.ErrnoException).code === "ENOENT" ||
          e instanceof SyntaxError
        ) {
          process.stderr.write(`infera bench: ${err.message}\n`);
          process.exitCode = 2;
          return;
        }
        throw e;
      }
    });
  refuseArgvSecrets(cmd, [{ key: "apiKey", env: "INFERA_API_KEY" }]);
}
