import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { buildStep, buildWarmup, ReuseTracker, tenantPrefixes } from "../../bench/fleet-routing/trace.ts";
import { getDefaultTokenizer } from "../../src/tokenizer/tokenizer.ts";

const tok = getDefaultTokenizer();
const step = { seed: 3, rate: 40, durationS: 50, questionWords: 12, maxTokens: 8 };

describe("fleet-routing trace", () => {
  it("is seeded: the same seeds give identical steps, another seed a different one", () => {
    const p = tenantPrefixes({ seed: 1, tenants: 6, prefixWords: 50 });
    assert.deepEqual(p, tenantPrefixes({ seed: 1, tenants: 6, prefixWords: 50 }));
    assert.notDeepEqual(p, tenantPrefixes({ seed: 2, tenants: 6, prefixWords: 50 }));
    const a = buildStep(p, step);
    assert.equal(JSON.stringify(a), JSON.stringify(buildStep(p, step)));
    assert.notEqual(JSON.stringify(a), JSON.stringify(buildStep(p, { ...step, seed: 4 })));
  });

  it("gives each tenant one prefix of the asked length, shared by all its requests", () => {
    const p = tenantPrefixes({ seed: 1, tenants: 5, prefixWords: 300 });
    assert.equal(new Set(p).size, 5);
    for (const x of p) {
      const n = tok.encode(x).length;
      // The words plus a short "Tenant i." header line.
      assert.ok(n >= 300 && n <= 320, `prefix of ${n} tokens`);
    }
    for (const r of buildStep(p, step)) {
      const t = Number(r.group?.split("-")[1]);
      assert.equal(r.messages?.[0].content, p[t]);
      assert.equal(r.messages?.[0].role, "system");
      assert.equal(r.messages?.[1].role, "user");
    }
  });

  it("arrives as a Poisson process at the asked mean rate, in order, within the window", () => {
    const p = tenantPrefixes({ seed: 1, tenants: 10, prefixWords: 5 });
    const reqs = buildStep(p, step);
    // 40/s over 50 s: 2000 expected; a Poisson count's sd is √2000 ≈ 45, so ±5 % is > 2 sd.
    assert.ok(Math.abs(reqs.length - 2000) < 100, `${reqs.length} requests`);
    const t = reqs.map((r) => r.arrivalMs ?? -1);
    for (let i = 1; i < t.length; i++) assert.ok(t[i] >= t[i - 1]);
    assert.ok(t[0] >= 0 && t[t.length - 1] < 50_000);
    // Exponential gaps: their sd equals their mean (25 ms here).
    const gaps = t.slice(1).map((x, i) => x - t[i]);
    const mean = gaps.reduce((a, b) => a + b, 0) / gaps.length;
    const sd = Math.sqrt(gaps.reduce((a, b) => a + (b - mean) ** 2, 0) / gaps.length);
    assert.ok(Math.abs(mean - 25) < 2, `mean gap ${mean}`);
    assert.ok(Math.abs(sd / mean - 1) < 0.1, `sd/mean ${sd / mean}`);
    assert.deepEqual(
      reqs.map((r) => r.index),
      reqs.map((_, i) => i),
    );
  });

  it("spreads tenants evenly, or gives the dominant tenant its share", () => {
    const p = tenantPrefixes({ seed: 1, tenants: 10, prefixWords: 5 });
    const share = (reqs: ReturnType<typeof buildStep>) => {
      const c = new Array<number>(10).fill(0);
      for (const r of reqs) c[Number(r.group?.split("-")[1])]++;
      return c.map((x) => x / reqs.length);
    };
    for (const s of share(buildStep(p, step))) assert.ok(Math.abs(s - 0.1) < 0.025, `share ${s}`);
    const hot = share(buildStep(p, { ...step, dominantShare: 0.5 }));
    assert.ok(Math.abs(hot[0] - 0.5) < 0.03, `dominant share ${hot[0]}`);
    for (const s of hot.slice(1)) assert.ok(Math.abs(s - 0.5 / 9) < 0.02, `other share ${s}`);
  });

  it("warms up with exactly one request per tenant, seeded, in arrival order", () => {
    const p = tenantPrefixes({ seed: 1, tenants: 40, prefixWords: 5 });
    const o = { seed: 9, rate: 8, questionWords: 4, maxTokens: 2 };
    const w = buildWarmup(p, o);
    assert.equal(JSON.stringify(w), JSON.stringify(buildWarmup(p, o)));
    assert.deepEqual(
      w.map((r) => Number(r.group?.split("-")[1])).sort((a, b) => a - b),
      p.map((_, i) => i),
    );
    for (let i = 1; i < w.length; i++) assert.ok((w[i].arrivalMs ?? 0) >= (w[i - 1].arrivalMs ?? 0));
    assert.notDeepEqual(
      w.map((r) => r.group),
      p.map((_, i) => `tenant-${i}`),
      "a shuffled order",
    );
  });

  it("counts as reachable the leading full blocks an earlier prompt shares, across steps", () => {
    const bs = 16;
    const p = tenantPrefixes({ seed: 1, tenants: 2, prefixWords: 200 });
    const msg = (t: number, q: string) => [
      { role: "system" as const, content: p[t] },
      { role: "user" as const, content: q },
    ];
    const prefixTokens = tok.encode(tok.applyChatTemplate([{ role: "system", content: p[0] }])).length;
    const tracker = new ReuseTracker(tok, bs);
    const first = tracker.add([
      { index: 0, messages: msg(0, "alpha one"), maxTokens: 1 },
      { index: 1, messages: msg(1, "beta two"), maxTokens: 1 },
      { index: 2, messages: msg(0, "gamma three"), maxTokens: 1 },
    ]);
    // Two first sightings reach nothing; the third shares tenant 0's prefix blocks.
    assert.equal(first.perRequest[0].reachable, 0);
    assert.equal(first.perRequest[1].reachable, 0);
    const shared = first.perRequest[2].reachable;
    assert.equal(shared % bs, 0);
    assert.ok(
      shared >= Math.floor(prefixTokens / bs) * bs - bs && shared <= prefixTokens,
      `${shared} of ${prefixTokens}`,
    );
    assert.equal(first.reachable, shared);
    assert.equal(
      first.prompt,
      first.perRequest.reduce((a, r) => a + r.prompt, 0),
    );
    // The next step remembers the first: tenant 1's prefix is reachable now.
    const second = tracker.add([{ index: 0, messages: msg(1, "delta four"), maxTokens: 1 }]);
    assert.ok(second.reachable > 0);
    // An identical prompt: everything but the block holding its last token.
    const again = tracker.add([{ index: 0, messages: msg(1, "delta four"), maxTokens: 1 }]);
    const n = again.perRequest[0].prompt;
    assert.equal(again.reachable, Math.floor((n - 1) / bs) * bs);
  });
});
