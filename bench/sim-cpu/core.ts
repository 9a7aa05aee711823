/**
 * The engine core alone, in-process: scheduler + block pool + token sampling + metrics
 * observer for 64 running sequences (~130-token prompts, 256 output tokens, refilled as they
 * finish), no HTTP, no timers. Prints CPU per generated token.
 *
 *   node bench/sim-cpu/core.ts
 */
import { BlockPool } from "../../src/engine/sim/block-pool.ts";
import { SimMetrics } from "../../src/engine/sim/metrics.ts";
import { OutputText, OutputVocab } from "../../src/engine/sim/output.ts";
import { personalityOf } from "../../src/engine/sim/personalities/index.ts";
import { Scheduler } from "../../src/engine/sim/scheduler.ts";
import { Sequence } from "../../src/engine/sim/sequence.ts";
import { getDefaultTokenizer } from "../../src/tokenizer/tokenizer.ts";
import { Mulberry32 } from "../../src/util/mulberry32.ts";

const vocab = OutputVocab.build(getDefaultTokenizer());
const pool = new BlockPool(100000, 16);
const metrics = new SimMetrics({
  personality: personalityOf("vllm"),
  modelName: "m",
  dpRank: 0,
  dpSize: 1,
  role: "mixed",
  gauges: { running: () => 0, waiting: () => 0, kvUsage: () => 0 },
  cache: { blockSize: 16, numGpuBlocks: 100000 },
});
const sched = new Scheduler(
  pool,
  { maxNumSeqs: 256, maxNumBatchedTokens: 8192, maxModelLen: 100000 },
  metrics,
);
let tokens = 0;
let k = 0;
const sink = {
  onToken(seq: Sequence) {
    tokens++;
    seq.output.takeDelta(false);
  },
  onFinish() {
    add();
  },
};
function add(): void {
  k++;
  sched.add(
    new Sequence({
      requestId: `r${k}`,
      index: 0,
      promptIds: Array.from({ length: 130 }, (_, i) => (k * 7 + i) % 5000),
      maxTokens: 256,
      limitReason: "length",
      salt: null,
      output: new OutputText(vocab, new Mulberry32(k), []),
      sink,
      arrivalMs: 0,
    }),
  );
}
for (let i = 0; i < 64; i++) add();
const run = (n: number): void => {
  const stop = tokens + n;
  while (tokens < stop) {
    const plan = sched.schedule();
    if (!plan) break;
    sched.complete(plan);
    pool.drain();
  }
};
run(50000); // warm up the JIT
const c0 = process.cpuUsage();
const before = tokens;
run(300000);
const c = process.cpuUsage(c0);
console.log(
  `engine core: ${((c.user + c.system) / (tokens - before)).toFixed(2)} us CPU per token (64 sequences)`,
);
