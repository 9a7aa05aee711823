/**
 * What walking more of a prompt costs the pending bridge (src/router/pipeline/pending-prefixes.ts),
 * which keys a routed prompt by its approximate-tree chunk path (src/kv/approx-tree.ts): the
 * path of the text, `add` per routed prompt and `match` per candidate, for heads of 32 Ki
 * characters (APPROX_TEXT_CAP), 208 Ki (a 40 k-token prompt of the bench's words) and 1 Mi (the
 * routing text cap), with `--held` prompts of that size already pending on the worker. Also what
 * the capped walk credits: a 40 k-token prompt pending on a worker counts as cached for only
 * cap / length of its blocks.
 *
 *   node bench/tokenizer/bridge.ts [--held 64] [--runs 200]
 */
import { loadavg } from "node:os";
import { parseArgs } from "node:util";
import { APPROX_TEXT_CAP, ApproxPrefixTree } from "../../src/kv/approx-tree.ts";
import { Prng, words } from "../../src/loadgen/prng.ts";
import { PendingPrefixes } from "../../src/router/pipeline/pending-prefixes.ts";

const { values } = parseArgs({
  options: { held: { type: "string", default: "64" }, runs: { type: "string", default: "200" } },
});
const HELD = Number(values.held);
const RUNS = Number(values.runs);

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

console.log(
  `# load average ${loadavg()
    .map((x) => x.toFixed(2))
    .join(" ")}; ${HELD} prompts pending, ${RUNS} runs`,
);
console.log("head chars   path ms   add ms   match ms (one candidate)   nodes");
const text = words(new Prng(9), 220_000); // ≈ 1.1 M characters
for (const cap of [APPROX_TEXT_CAP, 208 * 1024, 1024 * 1024]) {
  const tree = new ApproxPrefixTree({ chunkChars: 64, maxChars: cap });
  const pending = new PendingPrefixes({ graceMs: 1000 });
  // Other prompts pending on the worker (distinct texts, so the map holds HELD × nodes keys).
  for (let i = 0; i < HELD; i++) pending.add("w", tree.path(`${i} ${text}`));
  const tPath: number[] = [];
  const tAdd: number[] = [];
  const tMatch: number[] = [];
  let nodes = 0;
  for (let r = 0; r < RUNS; r++) {
    const t = `${r}:${text}`;
    let t0 = performance.now();
    const path = tree.path(t);
    tPath.push(performance.now() - t0);
    nodes = path.length;
    t0 = performance.now();
    pending.match("w", path);
    tMatch.push(performance.now() - t0);
    t0 = performance.now();
    pending.add("w", path);
    tAdd.push(performance.now() - t0);
  }
  console.log(
    `${String(cap).padStart(10)}   ${median(tPath).toFixed(3).padStart(7)}   ${median(tAdd).toFixed(3).padStart(6)}   ${median(tMatch).toFixed(3).padStart(8)}                 ${nodes}`,
  );
}
const long = words(new Prng(4), 40_000);
console.log(
  `# a 40 k-token prompt (${long.length} chars) pending on a worker: credited ${((100 * APPROX_TEXT_CAP) / long.length).toFixed(0)} % of its blocks with the ${APPROX_TEXT_CAP}-char walk, 100 % with the whole text`,
);
