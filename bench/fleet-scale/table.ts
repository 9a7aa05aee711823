/**
 * Markdown tables of bench/fleet-scale/results.json (for RESULTS.md):
 *   node bench/fleet-scale/table.ts [results.json]
 */
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const file = process.argv[2] ?? fileURLToPath(new URL("./results.json", import.meta.url));
// biome-ignore lint/suspicious/noExplicitAny: a report over the bench's own JSON
type J = any;
const data = JSON.parse(readFileSync(file, "utf8")) as J;
const f = (x: unknown, d = 1) => (typeof x === "number" && Number.isFinite(x) ? x.toFixed(d) : "n/a");
const shares = (c: Record<string, number>) =>
  Object.entries(c)
    .filter(([k]) => k !== "bench")
    .map(([k, v]) => `${k} ${f(v, 0)}`)
    .join(", ");

for (const r of data.runs as J[]) {
  console.log(
    `\n### ${r.workers} workers (scrape interval ${r.settings?.scrapeIntervalMs}, load average at start ${r.loadAverageStart})\n`,
  );
  if (r.stoppedBy) console.log(`**Stopped:** ${r.stoppedBy}\n`);
  if (r.fleet) console.log(`- fleet: up in ${r.fleet.startSeconds} s, ${r.fleet.rssIdleMiB} MiB RSS idle`);
  if (r.server1Idle)
    console.log(
      `- server 1: ready (all ${r.workers} subscribed and replayed) in ${r.server1Idle.readySeconds} s; idle RSS ${r.server1Idle.rssMiB} MiB; idle CPU % of one core: ${shares(r.server1Idle.cpuSharePct)}`,
    );
  if (r.replica2Startup) {
    const b = r.replica2Startup;
    console.log(
      `- replica 2 start-up: ready in ${b.readySeconds} s; replayed ${b.replayedEvents} events (${b.replayedBatches} batches) in ${b.burstSeconds} s = ${b.eventsPerSIsLowerBound ? "≥ " : ""}${b.eventsPerS} events/s wall; replay CPU ${f(b.replayCpuSeconds, 2)} s = ${b.cpuUsPerReplayedEvent} µs per event → ${b.replayedEventsPerCoreSecond} events/s per core; CPU: ${shares(b.cpuSharePct)}`,
    );
  }
  if (r.end)
    console.log(
      `- RSS at the end: server 1 ${r.end.server1RssMiB} MiB (peak ${r.end.server1PeakRssMiB}), server 2 ${r.end.server2RssMiB} MiB (peak ${r.end.server2PeakRssMiB}), fleet ${r.end.fleetRssMiB} MiB (peak ${r.end.fleetPeakRssMiB})`,
    );
  console.log(`- peak RSS of fleet + servers: ${r.peakRssMiBFleetAndServers} MiB`);
  const phases: J[] = [
    ...(r.ingestOnly ? [r.ingestOnly] : []),
    ...(r.oneReplica ?? []),
    ...(r.twoReplicasClientSpread ?? []),
    ...(r.twoReplicas ?? []),
  ];
  if (phases.length === 0) continue;
  console.log(
    "\n| phase | offered req/s | answered/s | not sent | errors | client p50 / p99 ms | decision p50 / p99 / mean ms | KV events/s (peak between scrapes) | server CPU % | CPU ms/request | CPU µs/event | CPU % of one core (all) | load avg after |",
  );
  console.log("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
  for (const p of phases) {
    const c = p.client;
    const errs = Object.values(c.errors as Record<string, number>).reduce((a, b) => a + b, 0);
    const sv = p.servers as J[];
    const per = (fn: (s: J) => string) =>
      sv.length === 1 ? fn(sv[0]) : sv.map((s, i) => `s${i + 1}: ${fn(s)}`).join("; ");
    console.log(
      `| ${p.label} | ${p.rate} | ${f(c.okPerS, 0)} | ${c.notSent} | ${errs} | ${f(c.latencyMs.p50, 0)} / ${f(c.latencyMs.p99, 0)} | ${per((s) => (s.decisions > 0 ? `${f(s.decisionMs.p50, 3)} / ${f(s.decisionMs.p99, 2)} / ${f(s.decisionMs.mean, 3)}` : "—"))} | ${per((s) => `${s.kvEventsPerS} (${s.peakKvEventsPerSample})`)} | ${per((s) => f(s.cpuPct, 0))} | ${per((s) => f(s.cpuMsPerRoutedRequest, 2))} | ${p.label.startsWith("ingest") ? per((s) => `${f(s.cpuUsPerKvEvent, 0)} (${s.cpuUsPerKvEventAboveIdle > 0 ? f(s.cpuUsPerKvEventAboveIdle, 0) : "n/a"} above idle)`) : "—"} | ${shares(p.cpuSharePct)} | ${p.loadAverage.after} |`,
    );
  }
}
