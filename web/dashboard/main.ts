/**
 * The dashboard page (bundled with uPlot by esbuild into app.js/app.css; see
 * scripts/dashboard-bundle.mjs). It polls GET /dashboard/state (the same JSON the tests read)
 * and redraws: the fleet per model, PD pairs and transfers, traffic charts, and the routing
 * decisions feed (click one to see its candidates' scores and prompt overlap).
 */
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import "./style.css";
// The JSON's shape, shared with the server that makes it (a types-only module with no node imports).
import type {
  CandidateExplanation,
  DecisionExplanationJson as Decision,
  FlowView,
  DashboardModel as ModelView,
  DashboardSnapshot as Snapshot,
  TrafficPoint,
  DashboardWorker as Worker,
} from "../../src/server/dashboard/wire.ts";

type Candidate = CandidateExplanation<number | null>;

const params = new URLSearchParams(location.search);
/**
 * The API key comes once in the address (`?key=`, a browser cannot send a header there); it
 * is taken out of the URL at once (history.replaceState) so it is not in the history, a
 * bookmark or a shared screenshot, and sent as an Authorization header. Polls after a reload
 * are authenticated by the session cookie the server set with the page (HttpOnly,
 * SameSite=Strict). The server also sends Referrer-Policy: no-referrer, so no sub-request
 * carried the key in its Referer even before this ran.
 */
const key = takeKey();

function takeKey(): string | null {
  const fromUrl = params.get("key");
  if (fromUrl === null) return null;
  params.delete("key");
  const rest = params.toString();
  history.replaceState(history.state, "", `${location.pathname}${rest ? `?${rest}` : ""}${location.hash}`);
  return fromUrl;
}
const intervalMs = Math.max(200, Number(params.get("interval")) || 1000);
const app = document.getElementById("app")!;
const statusEl = document.getElementById("status")!;

let selected: string | null = null;
let last: Snapshot | null = null;
const charts = new Map<string, uPlot>();

function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  ...kids: Array<Node | string>
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const c of kids) e.append(c);
  return e;
}

const fmt = (v: number | null | undefined, digits = 0): string =>
  v === null || v === undefined || Number.isNaN(v) ? "—" : v.toFixed(digits);
const pct = (v: number | null | undefined): string =>
  v === null || v === undefined ? "—" : `${(v * 100).toFixed(1)}%`;
const ms = (v: number | null | undefined): string =>
  v === null || v === undefined ? "—" : `${(v * 1000).toFixed(1)} ms`;
const short = (id: string): string => id.split("@")[0] ?? id;

function table(cls: string, head: string[], rows: HTMLTableRowElement[]): HTMLTableElement {
  return h(
    "table",
    { class: cls },
    h("thead", {}, h("tr", {}, ...head.map((x) => h("th", {}, x)))),
    h("tbody", {}, ...rows),
  );
}

function fleet(m: ModelView): HTMLElement {
  const rows = m.workers.map((w: Worker) =>
    h(
      "tr",
      { "data-worker": w.id, class: `state-${w.state}` },
      h("td", { title: w.url }, short(w.id)),
      h("td", {}, w.role),
      h("td", {}, w.engine),
      h("td", {}, w.connector),
      h("td", { class: "state" }, w.state),
      h("td", { "data-field": "inFlight" }, String(w.inFlight)),
      h("td", { "data-field": "routed" }, String(w.routed)),
      h("td", { "data-field": "waiting" }, fmt(w.waiting)),
      h("td", { "data-field": "kvUsage" }, pct(w.kvUsage)),
      h("td", { "data-field": "indexBlocks" }, fmt(w.indexBlocks)),
      h("td", { "data-field": "indexSync", class: `sync-${w.indexSync ?? "none"}` }, w.indexSync ?? "–"),
    ),
  );
  return h(
    "section",
    { class: "panel fleet" },
    h("h3", {}, `Fleet (${m.workers.length} workers, ${m.router ?? "no"} router)`),
    table(
      "fleet-table",
      [
        "worker",
        "role",
        "engine",
        "connector",
        "state",
        "in flight",
        "routed",
        "waiting",
        "KV usage",
        "index blocks",
        "index sync",
      ],
      rows,
    ),
  );
}

function pd(m: ModelView): HTMLElement {
  const s = h("section", { class: "panel pd" }, h("h3", {}, "PD pairs and transfers"));
  if (m.pd.pairs.length === 0) {
    s.append(h("p", { class: "muted" }, "No prefill/decode pairs in the recent decisions."));
    return s;
  }
  s.append(
    table(
      "pd-pairs",
      ["prefill", "decode", "requests"],
      m.pd.pairs.map((p) =>
        h(
          "tr",
          {},
          h("td", {}, short(p.prefill)),
          h("td", {}, short(p.decode)),
          h("td", {}, String(p.count)),
        ),
      ),
    ),
    table(
      "pd-transfers",
      ["time", "request", "prefill → decode"],
      m.pd.transfers.map((t) =>
        h(
          "tr",
          {},
          h("td", {}, new Date(t.at).toLocaleTimeString()),
          h("td", {}, t.requestId),
          h("td", {}, `${short(t.prefill)} → ${short(t.decode)}`),
        ),
      ),
    ),
  );
  return s;
}

type Metric = "ttft" | "itl" | "e2e";
const CHARTS: Array<{ id: string; title: string; metric?: Metric }> = [
  { id: "rps", title: "Requests / s" },
  { id: "ttft", title: "TTFT (ms)", metric: "ttft" },
  { id: "itl", title: "ITL (ms)", metric: "itl" },
  { id: "e2e", title: "End-to-end (ms)", metric: "e2e" },
  { id: "hit", title: "Cache hit rate (cached / prompt tokens, %)" },
];
const COLORS = ["#2563eb", "#f59e0b", "#dc2626"];

function chartData(id: string, series: TrafficPoint[]): uPlot.AlignedData {
  const xs = series.map((p) => p.t / 1000);
  const c = CHARTS.find((x) => x.id === id)!;
  const ms1 = (v: number | null): number | null => (v === null ? null : v * 1000);
  if (c.metric) {
    const m = c.metric;
    return [
      xs,
      series.map((p) => ms1(p[m].p50)),
      series.map((p) => ms1(p[m].p90)),
      series.map((p) => ms1(p[m].p99)),
    ] as uPlot.AlignedData;
  }
  if (id === "rps") return [xs, series.map((p) => p.rps)];
  return [
    xs,
    series.map((p) => (p.cacheHitRate === null ? null : p.cacheHitRate * 100)),
  ] as uPlot.AlignedData;
}

function traffic(m: ModelView, box: HTMLElement): void {
  const series = m.traffic.series;
  const lastPoint = series[series.length - 1];
  const summary = h(
    "div",
    { class: "traffic-summary" },
    h("span", { "data-field": "rps" }, `${fmt(lastPoint?.rps, 2)} req/s`),
    h("span", { "data-field": "ttft-p50" }, `TTFT p50 ${ms(lastPoint?.ttft.p50)}`),
    h("span", { "data-field": "e2e-p99" }, `e2e p99 ${ms(lastPoint?.e2e.p99)}`),
    h("span", { "data-field": "cache-hit" }, `cache hit ${pct(lastPoint?.cacheHitRate)}`),
    h("span", { "data-field": "requests" }, `${m.traffic.totals.requests} requests`),
  );
  const old = box.querySelector(".traffic-summary");
  if (old) old.replaceWith(summary);
  else box.querySelector("h3")!.after(summary);
  for (const c of CHARTS) {
    const k = `${m.name}/${c.id}`;
    const data = chartData(c.id, series);
    const chart = charts.get(k);
    if (chart) {
      chart.setData(data);
      continue;
    }
    const holder = h("div", { class: "chart", "data-chart": c.id });
    box.append(holder);
    const lines: uPlot.Series[] = c.metric
      ? ["p50", "p90", "p99"].map((label, i) => ({ label, stroke: COLORS[i], width: 1.5, spanGaps: true }))
      : [{ label: c.id === "rps" ? "req/s" : "hit %", stroke: COLORS[0], width: 1.5, spanGaps: true }];
    const opts: uPlot.Options = {
      title: c.title,
      width: 420,
      height: 180,
      series: [{}, ...lines],
      axes: [{}, { size: 50 }],
    };
    charts.set(k, new uPlot(opts, data, holder));
  }
}

function decisionsPanel(list: Decision[]): HTMLElement {
  const rows = list.map((d) => {
    const tr = h(
      "tr",
      { "data-request": d.requestId, class: d.requestId === selected ? "selected" : "" },
      h("td", {}, new Date(d.at).toLocaleTimeString()),
      h("td", {}, d.requestId),
      h("td", {}, d.model),
      h("td", {}, d.step),
      h("td", { class: "winner" }, short(d.winner)),
      h("td", {}, d.reason),
      h("td", {}, String(d.candidates.filter((c) => !c.filtered).length)),
    );
    tr.addEventListener("click", () => {
      selected = d.requestId;
      render();
    });
    return tr;
  });
  return h(
    "section",
    { class: "panel decisions" },
    h("h3", {}, `Routing decisions (the last ${list.length}, newest first; click one for why)`),
    h(
      "div",
      { class: "scroll" },
      table("decisions-table", ["time", "request", "model", "step", "winner", "reason", "candidates"], rows),
    ),
  );
}

/** Why the request went where it went: each candidate's scorer values, the winner marked. */
function explanation(d: Decision): HTMLElement {
  const scorers = [...new Set(d.candidates.flatMap((c) => Object.keys(c.scores)))];
  const rows = d.candidates.map((c: Candidate) => {
    // The prompt's leading blocks this worker caches, as the step's overlap source counted them
    // (absolute, filtered candidates included); "—" when the profile reads no overlap.
    const cached = c.cachedBlocks ?? null;
    const prompt = c.promptBlocks ?? null;
    const known = cached !== null && prompt !== null;
    // Of those, the blocks the pending bridge credited (prompts routed there that the engine's
    // events have not confirmed yet); "—" when the profile has no bridge.
    const bridge = c.bridgeBlocks ?? null;
    const bar = h("span", { class: "bar" });
    const bridgeBar = h("span", { class: "bar bridge" });
    if (known && prompt > 0) {
      const b = Math.min(bridge ?? 0, cached);
      const px = (n: number) => `${Math.round((Math.min(n, prompt) / prompt) * 120)}px`;
      bar.style.width = px(cached - b);
      bridgeBar.style.width = px(b);
    }
    return h(
      "tr",
      { "data-candidate": c.worker, class: c.worker === d.winner ? "winner" : c.filtered ? "filtered" : "" },
      h("td", {}, `${short(c.worker)}${c.worker === d.winner ? " ★ served" : ""}`),
      ...scorers.map((s) => h("td", {}, c.filtered ? "filtered" : fmt(c.scores[s], 2))),
      h("td", {}, c.filtered ? "—" : fmt(c.total, 2)),
      h(
        "td",
        {
          class: "overlap",
          "data-cached": known ? String(cached) : "",
          "data-prompt": known ? String(prompt) : "",
        },
        known ? `${cached} / ${prompt}` : "—",
        bar,
        bridgeBar,
      ),
      h(
        "td",
        { class: "bridge-blocks", "data-bridge": bridge === null ? "" : String(bridge) },
        bridge === null ? "—" : String(bridge),
      ),
      // The predictor's TTFT for this candidate, and what the winner then observed.
      h(
        "td",
        { class: "ttft", "data-predicted": String(c.predictedTtftMs ?? "") },
        c.predictedTtftMs === undefined
          ? "—"
          : `${fmt(c.predictedTtftMs ?? Number.NaN, 0)}${c.worker === d.winner && d.observedTtftMs != null ? ` (${fmt(d.observedTtftMs, 0)})` : ""}`,
      ),
    );
  });
  return h(
    "section",
    { class: "panel explain", "data-explain": d.requestId },
    h(
      "h3",
      {},
      `Request ${d.requestId} (${d.step}) → `,
      h("b", { class: "explain-winner" }, d.winner),
      ` — ${d.reason}`,
    ),
    table(
      "explain-table",
      [
        "candidate",
        ...scorers,
        "total (lower wins)",
        "prompt cached (blocks / prompt blocks)",
        "of which pending bridge (blocks)",
        "TTFT ms predicted (observed)",
      ],
      rows,
    ),
  );
}

/** Flow control: queue depth per band and flow, waits, refusals (absent without `flow`). */
function flowPanel(f: FlowView): HTMLElement {
  const rows: HTMLTableRowElement[] = [];
  for (const b of f.bands) {
    const depth = b.flows.reduce((a, x) => a + x.depth, 0);
    rows.push(
      h(
        "tr",
        { class: "band" },
        h("td", {}, b.band),
        h("td", {}, "all"),
        h("td", {}, String(depth)),
        h("td", {}, depth ? `${b.oldestMs} ms` : "—"),
        h("td", {}, ""),
      ),
    );
    for (const fl of b.flows)
      rows.push(
        h(
          "tr",
          {},
          h("td", {}, ""),
          h("td", {}, fl.flow),
          h("td", {}, String(fl.depth)),
          h("td", {}, ""),
          h("td", {}, String(fl.counter)),
        ),
      );
  }
  const rejected = Object.entries(f.rejected)
    .map(([k, v]) => `${k} ${v}`)
    .join(" · ");
  const w = f.waits;
  return h(
    "section",
    { class: "panel flow", id: "flow" },
    h("h3", {}, `Admission queue · ${f.depth} waiting`),
    table("flow-table", ["band", "flow", "queued", "oldest wait", "VTC tokens"], rows),
    h("p", {}, `waits (last ${w.count}): p50 ${fmt(w.p50)} ms · p90 ${fmt(w.p90)} ms · max ${fmt(w.max)} ms`),
    h("p", {}, `rejections: ${rejected || "none"}`),
  );
}

const modelBoxes = new Map<string, { root: HTMLElement; traffic: HTMLElement; body: HTMLElement }>();

function render(): void {
  const s = last;
  if (!s) return;
  for (const m of s.models) {
    let box = modelBoxes.get(m.name);
    if (!box) {
      const trafficBox = h("section", { class: "panel traffic" }, h("h3", {}, "Traffic"));
      const body = h("div", { class: "model-body" });
      const root = h(
        "article",
        { class: "model", "data-model": m.name },
        h("h2", {}, m.name),
        body,
        trafficBox,
      );
      app.append(root);
      box = { root, traffic: trafficBox, body };
      modelBoxes.set(m.name, box);
    }
    box.body.replaceChildren(fleet(m), pd(m));
    traffic(m, box.traffic);
  }
  const oldFlow = document.getElementById("flow");
  if (s.flow) {
    const panel = flowPanel(s.flow);
    if (oldFlow) oldFlow.replaceWith(panel);
    else app.prepend(panel);
  } else oldFlow?.remove();
  let feed = document.getElementById("feed");
  if (!feed) {
    feed = h("div", { id: "feed" });
    app.append(feed);
  }
  const chosen = s.decisions.find((d) => d.requestId === selected);
  feed.replaceChildren(
    ...(s.ttftPrediction?.length ? [predictorPanel(s.ttftPrediction)] : []),
    ...(chosen ? [explanation(chosen)] : []),
    decisionsPanel(s.decisions),
  );
}

/** The TTFT predictor's error over its last observations, per model. */
function predictorPanel(rows: NonNullable<Snapshot["ttftPrediction"]>): HTMLElement {
  const pct = (v: number) => (Number.isFinite(v) ? `${Math.round(v * 100)} %` : "—");
  return h(
    "section",
    { class: "panel predictor" },
    h("h3", {}, "TTFT predictor: |predicted − observed| / observed"),
    table(
      "predictor-table",
      ["model", "samples", "median", "p90"],
      rows.map((r) =>
        h(
          "tr",
          { "data-model": r.model },
          h("td", {}, r.model),
          h("td", {}, String(r.samples)),
          h("td", {}, pct(r.median)),
          h("td", {}, pct(r.p90)),
        ),
      ),
    ),
  );
}

async function poll(): Promise<void> {
  try {
    const res = await fetch("/dashboard/state?limit=50", {
      headers: key ? { authorization: `Bearer ${key}` } : {},
      cache: "no-store",
    });
    if (res.status === 401) {
      statusEl.textContent = "API key required: open /dashboard?key=<your key>";
      statusEl.className = "error";
      return;
    }
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    last = (await res.json()) as Snapshot;
    statusEl.textContent = `policy ${last.server.policy}${last.server.draining ? " · DRAINING" : ""} · updated ${new Date(last.at).toLocaleTimeString()}`;
    statusEl.className = last.server.draining ? "warn" : "ok";
    document.body.dataset.updated = String(last.at);
    render();
  } catch (err) {
    statusEl.textContent = `disconnected (${(err as Error).message})`;
    statusEl.className = "error";
  } finally {
    setTimeout(() => void poll(), intervalMs);
  }
}

void poll();
