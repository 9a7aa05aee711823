/**
 * Polls `cond` every `stepMs` until it holds; throws once `timeoutMs` has passed without it.
 * The condition is checked before the first sleep, so one that already holds costs no wait.
 */
export async function waitUntil(
  cond: () => boolean | Promise<boolean>,
  timeoutMs: number,
  what: string,
  stepMs = 10,
): Promise<void> {
  const t0 = Date.now();
  while (!(await cond())) {
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, stepMs));
  }
}

/**
 * Polls `url` until it answers 200 (a refused connection counts as not yet). On time-out the
 * error carries `output()` (e.g. the process's recent logs) after the message.
 */
export async function waitFor200(
  url: string,
  o: { timeoutMs: number; what: string; stepMs?: number; output?: () => string },
): Promise<void> {
  await waitUntil(
    async () => {
      try {
        return (await fetch(url, { signal: AbortSignal.timeout(2000) })).status === 200;
      } catch {
        return false;
      }
    },
    o.timeoutMs,
    o.what,
    o.stepMs,
  ).catch((e) => {
    throw o.output ? new Error(`${(e as Error).message}: ${o.output()}`) : e;
  });
}
