/**
 * The dashboard's PD view (issue #21) against a real disaggregated setup: `infera server` in
 * front of 1 prefill + 1 decode sim on nixl, requests through the openai client. The pairs and
 * transfers in GET /dashboard/state must name the workers that actually served (the sims' own
 * metrics and /debug/decisions say which), grow with the requests, and the workers carry their
 * roles. dashboard.test.ts covers the join only with decisions written into the ring by hand.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { ask, type PdCluster, promptSources, startPdCluster } from "../router/disagg/pd-cluster.ts";

interface PdState {
  models: Array<{
    name: string;
    router: string | null;
    workers: Array<{ id: string; role: string; connector: string; routed: number }>;
    pd: {
      pairs: Array<{ prefill: string; decode: string; count: number }>;
      transfers: Array<{ requestId: string; prefill: string; decode: string; at: number }>;
    };
  }>;
}

interface Decision {
  requestId: string;
  step: string;
  winner: string;
}

describe("dashboard PD view, 1P1D nixl end to end", () => {
  let c: PdCluster;
  before(async () => {
    c = await startPdCluster({ kind: "nixl" });
  });
  after(async () => {
    await c?.close();
  });

  const state = async (): Promise<PdState["models"][number]> => {
    const r = await fetch(`${c.url}/dashboard/state`);
    assert.equal(r.status, 200);
    const s = (await r.json()) as PdState;
    assert.equal(s.models.length, 1);
    return s.models[0]!;
  };

  test("pairs and transfers name the workers that served, growing per request", async (tc) => {
    let failed = true;
    tc.after(() => {
      if (failed) console.error(c.dump());
    });
    const p = c.prefills[0]!.record.id;
    const d = c.decodes[0]!.record.id;
    assert.ok(p && d);

    const m0 = await state();
    assert.equal(m0.router, "disagg");
    const roles = Object.fromEntries(m0.workers.map((w) => [w.id, [w.role, w.connector]]));
    assert.deepEqual(roles, { [p]: ["prefill", "nixl"], [d]: ["decode", "nixl"] });
    assert.deepEqual(m0.pd, { pairs: [], transfers: [] });

    const n = 3;
    for (let i = 1; i <= n; i++) {
      const out = await ask(c, `dash-pd-${i}`, 3);
      assert.equal(out.usage?.completion_tokens, 3);
      const m = await state();
      assert.equal(m.pd.transfers.length, i, `transfers after request ${i}`);
      assert.deepEqual(m.pd.pairs, [{ prefill: p, decode: d, count: i }]);
      for (const t of m.pd.transfers) assert.deepEqual([t.prefill, t.decode], [p, d]);
      // Newest first.
      const at = m.pd.transfers.map((t) => t.at);
      assert.deepEqual(
        at,
        [...at].sort((a, b) => b - a),
      );
    }

    // The same requests in the decision ring: one prefill and one decode step per transfer.
    const m = await state();
    const dr = await fetch(`${c.url}/debug/decisions`);
    assert.equal(dr.status, 200);
    const decisions = ((await dr.json()) as { data: Decision[] }).data;
    for (const step of ["prefill", "decode"]) {
      const ids = decisions
        .filter((x) => x.step === step)
        .map((x) => x.requestId)
        .sort();
      assert.deepEqual(ids, m.pd.transfers.map((t) => t.requestId).sort(), `${step} decisions`);
      const want = step === "prefill" ? p : d;
      assert.ok(
        decisions.filter((x) => x.step === step).every((x) => x.winner === want),
        step,
      );
    }
    assert.equal(new Set(m.pd.transfers.map((t) => t.requestId)).size, n);

    // The sims agree: P computed the prompts, D pulled them over the connector.
    const ps = await promptSources(c.prefills[0]!.sim);
    const ds = await promptSources(c.decodes[0]!.sim);
    assert.ok(ps.local > 0, `prefill computed: ${JSON.stringify(ps)}`);
    assert.ok(ds.external > 0, `decode pulled: ${JSON.stringify(ds)}`);
    assert.ok(ds.external > ds.local, `decode pulled more than it computed: ${JSON.stringify(ds)}`);
    const routed = Object.fromEntries(m.workers.map((w) => [w.id, w.routed]));
    assert.deepEqual(routed, { [p]: n, [d]: n });
    failed = false;
  });
});
