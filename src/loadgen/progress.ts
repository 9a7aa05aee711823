import type { ProgressUpdate } from "./types.ts";

export interface ProgressReporter {
  update(p: ProgressUpdate): void;
  /** Writes the final state and ends the line. */
  finish(): void;
}

/**
 * On a TTY: one bar redrawn in place at most 10 times a second. Otherwise: a plain line every
 * `intervalMs` (default 5 s) and at the end, so CI logs stay short.
 */
export function createProgress(
  stream: NodeJS.WriteStream | NodeJS.WritableStream = process.stderr,
  opts: { tty?: boolean; intervalMs?: number } = {},
): ProgressReporter {
  const tty = opts.tty ?? (stream as NodeJS.WriteStream).isTTY === true;
  const interval = opts.intervalMs ?? (tty ? 100 : 5000);
  let last: ProgressUpdate | null = null;
  let lastDraw = Number.NEGATIVE_INFINITY;
  const line = (p: ProgressUpdate): string => {
    const secs = p.elapsedMs / 1000;
    const rate = secs > 0 ? p.done / secs : 0;
    return `${p.done}/${p.total} done, ok ${p.ok}, errors ${p.errors}, in flight ${p.inFlight}, ${secs.toFixed(1)} s, ${rate.toFixed(1)} req/s`;
  };
  const bar = (p: ProgressUpdate): string => {
    const width = 30;
    const frac = p.total > 0 ? p.done / p.total : 1;
    const filled = Math.round(frac * width);
    return `\r[${"#".repeat(filled)}${".".repeat(width - filled)}] ${(frac * 100).toFixed(0).padStart(3)}% ${line(p)}\x1b[K`;
  };
  const draw = (p: ProgressUpdate) => stream.write(tty ? bar(p) : `bench: ${line(p)}\n`);
  const started = Date.now();
  // Plain mode prints on a timer, so a stalled run still shows signs of life.
  const timer = tty
    ? null
    : setInterval(() => {
        if (last) draw({ ...last, elapsedMs: Date.now() - started });
      }, interval);
  timer?.unref();
  return {
    update(p) {
      last = p;
      if (tty && p.elapsedMs - lastDraw >= interval) {
        lastDraw = p.elapsedMs;
        draw(p);
      }
    },
    finish() {
      if (timer) clearInterval(timer);
      if (last) draw(last);
      if (tty) stream.write("\n");
    },
  };
}
