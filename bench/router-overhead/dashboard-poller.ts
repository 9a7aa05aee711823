// Target (f) of bench/router-overhead/run.ts: the dashboard page open during a run.

/** Polls of /dashboard/state made during (f), and their total latency. */
export const dashboardStats = { polls: 0, ms: 0, failed: 0 };

/**
 * The dashboard page open: GET /dashboard/state at once, then every `everyMs` until
 * stopped. The first poll at the start of every run makes a short run see at least one
 * (more than a page would), so (f) errs on the side of showing a cost.
 */
export function dashboardPoller(url: string, everyMs: number): () => Promise<void> {
  let inFlight: Promise<void> = Promise.resolve();
  const poll = () => {
    const t0 = performance.now();
    inFlight = fetch(`${url}/dashboard/state?limit=50`).then(
      async (r) => {
        await r.text();
        if (!r.ok) dashboardStats.failed++;
        dashboardStats.polls++;
        dashboardStats.ms += performance.now() - t0;
      },
      () => {
        dashboardStats.failed++;
      },
    );
  };
  poll();
  const timer = setInterval(poll, everyMs);
  return async () => {
    clearInterval(timer);
    await inFlight;
  };
}
