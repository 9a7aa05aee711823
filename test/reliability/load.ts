/**
 * Load generation for the reliability suite: closed-loop clients that keep N requests in
 * flight, alternating streamed and non-streamed, and classify every outcome. Non-streamed
 * requests go through the official `openai` client; streamed ones through fetch (undici) with
 * our own SSE reader, so the exact end of each stream (error event, `[DONE]`) can be checked.
 */
import OpenAI from "openai";

export interface StreamOutcome {
  status: number;
  /** Data events carrying choices (content) before the end. */
  chunks: number;
  /** The `error` object of an error event, if one came. */
  error: { message?: string; type?: string; code?: string | null; param?: string | null } | null;
  sawDone: boolean;
  /** Thrown by fetch / the body read (connection cut without a clean end). */
  thrown: string | null;
}

/** Reads an SSE completion stream to its end. */
export async function streamChat(
  baseUrl: string,
  body: Record<string, unknown>,
  headers: Record<string, string> = {},
  signal?: AbortSignal,
): Promise<StreamOutcome> {
  const out: StreamOutcome = { status: 0, chunks: 0, error: null, sawDone: false, thrown: null };
  try {
    const res = await fetch(`${baseUrl}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify({ ...body, stream: true }),
      signal,
    });
    out.status = res.status;
    if (!res.body) return out;
    const dec = new TextDecoder();
    let buf = "";
    for await (const part of res.body) {
      buf += dec.decode(part, { stream: true });
      for (let at = buf.indexOf("\n\n"); at >= 0; at = buf.indexOf("\n\n")) {
        const ev = buf.slice(0, at);
        buf = buf.slice(at + 2);
        onEvent(ev, out);
      }
    }
    if (buf.trim() !== "") onEvent(buf, out);
  } catch (err) {
    out.thrown = (err as Error).message ?? String(err);
  }
  return out;
}

function onEvent(ev: string, out: StreamOutcome): void {
  for (const line of ev.split("\n")) {
    if (!line.startsWith("data:")) continue;
    const data = line.slice(5).trim();
    if (data === "[DONE]") {
      out.sawDone = true;
      continue;
    }
    try {
      const j = JSON.parse(data) as { error?: StreamOutcome["error"]; choices?: unknown[] };
      if (j.error) out.error = j.error;
      else if (Array.isArray(j.choices) && j.choices.length > 0) out.chunks++;
    } catch {
      // not JSON: counted as neither
    }
  }
}

export interface LoadCounts {
  sent: number;
  ok: number;
  /** Failed before any content reached the client (should have been retried elsewhere). */
  lost: number;
  /** Streams that had started and ended with an error event followed by [DONE]. */
  streamErrorsClean: number;
  /** Streams that had started and were cut without a clean error + [DONE]. */
  streamErrorsDirty: number;
  /** Short descriptions of what went wrong, for assertion messages. */
  samples: string[];
}

export const newCounts = (): LoadCounts => ({
  sent: 0,
  ok: 0,
  lost: 0,
  streamErrorsClean: 0,
  streamErrorsDirty: 0,
  samples: [],
});

function note(c: LoadCounts, s: string): void {
  if (c.samples.length < 8) c.samples.push(s);
}

export interface LoadOptions {
  baseUrl: string;
  model: string;
  concurrency: number;
  /** Keep sending until this returns true (checked between requests). */
  stop: () => boolean;
  streamMaxTokens: number;
  wholeMaxTokens: number;
  apiKey?: string;
  /** Counts to add to (default: fresh ones); a function picks them per request (e.g. per phase). */
  counts?: LoadCounts | (() => LoadCounts);
  /** Picks the counts per request from its start and end times (performance.now()); wins over counts. */
  bucket?: (startedAt: number, endedAt: number) => LoadCounts;
}

/** Runs `concurrency` closed-loop clients until `stop()`; returns the counts. */
export async function runLoad(o: LoadOptions): Promise<LoadCounts> {
  const fixed = typeof o.counts === "object" ? o.counts : newCounts();
  const countsNow = typeof o.counts === "function" ? o.counts : () => fixed;
  const client = new OpenAI({ baseURL: `${o.baseUrl}/v1`, apiKey: o.apiKey ?? "none", maxRetries: 0 });
  const headers: Record<string, string> = o.apiKey ? { authorization: `Bearer ${o.apiKey}` } : {};
  let seq = 0;
  const one = async (c: LoadCounts, n: number, streamed: boolean): Promise<void> => {
    const messages = [{ role: "user" as const, content: `reliability request ${n}` }];
    c.sent++;
    if (streamed) {
      const r = await streamChat(
        o.baseUrl,
        { model: o.model, messages, max_tokens: o.streamMaxTokens },
        headers,
      );
      if (r.status === 200 && r.error === null && r.sawDone && r.thrown === null) {
        c.ok++;
      } else if (r.status !== 200 || r.chunks === 0) {
        c.lost++;
        note(c, `stream lost: status ${r.status} ${r.thrown ?? r.error?.message ?? ""}`);
      } else if (r.error && r.sawDone && r.thrown === null) {
        c.streamErrorsClean++;
      } else {
        c.streamErrorsDirty++;
        note(c, `stream cut: ${r.chunks} chunks, error=${!!r.error}, done=${r.sawDone}, ${r.thrown ?? ""}`);
      }
      return;
    }
    try {
      const res = await client.chat.completions.create({
        model: o.model,
        messages,
        max_tokens: o.wholeMaxTokens,
      });
      if (res.choices.length > 0) c.ok++;
      else {
        c.lost++;
        note(c, "empty choices");
      }
    } catch (err) {
      c.lost++;
      note(c, `non-streamed: ${(err as Error).message}`);
    }
  };
  const loop = async (lane: number): Promise<void> => {
    for (let i = 0; !o.stop(); i++) {
      const startedAt = performance.now();
      if (!o.bucket) {
        await one(countsNow(), seq++, (lane + i) % 2 === 0);
        continue;
      }
      // Counted once the request has ended, so the bucket can look at both times.
      const mine = newCounts();
      await one(mine, seq++, (lane + i) % 2 === 0);
      const c = o.bucket(startedAt, performance.now());
      c.sent += mine.sent;
      c.ok += mine.ok;
      c.lost += mine.lost;
      c.streamErrorsClean += mine.streamErrorsClean;
      c.streamErrorsDirty += mine.streamErrorsDirty;
      for (const smp of mine.samples) note(c, smp);
    }
  };
  await Promise.all(Array.from({ length: o.concurrency }, (_, i) => loop(i)));
  return countsNow();
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Sum of all samples of a Prometheus counter in the server's /metrics text. */
export function metricSum(text: string, name: string): number {
  let total = 0;
  for (const line of text.split("\n")) {
    if (line.startsWith(`${name}{`) || line.startsWith(`${name} `)) total += Number(line.split(" ").pop());
  }
  return total;
}

/** Every request that did not end well, whatever the way. */
export const failures = (c: LoadCounts): number => c.lost + c.streamErrorsClean + c.streamErrorsDirty;
