/**
 * One coarse clock for every raw HTTP/1.1 connection's deadlines (connect, answer head, body
 * gap, idle eviction): a single unref'd interval that runs only while connections exist, in
 * place of a timer armed and cleared per request and phase. A request whose timeout is shorter
 * than a few ticks gets a precise timer of its own instead (see Http1Connection).
 */

/** Something with deadlines, checked every tick. */
export interface Swept {
  sweep(now: number, tickMs: number): void;
}

export const TICK_MS = 500;
/** Timeouts under this get a precise timer, since the sweep would overshoot them by up to a tick. */
export const PRECISE_BELOW_MS = 4 * TICK_MS;

const live = new Set<Swept>();
let timer: NodeJS.Timeout | null = null;

function tick(): void {
  const now = Date.now();
  for (const s of live) s.sweep(now, TICK_MS);
}

export function watch(s: Swept): void {
  live.add(s);
  if (timer === null) {
    timer = setInterval(tick, TICK_MS);
    timer.unref();
  }
}

export function unwatch(s: Swept): void {
  live.delete(s);
  if (live.size === 0 && timer !== null) {
    clearInterval(timer);
    timer = null;
  }
}
