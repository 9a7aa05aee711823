/**
 * Programmatic API of `infera bench`, for benchmarks that drive load in-process:
 *
 *   import { runBench, formatTable } from "../../src/loadgen/index.ts";
 *   const r = await runBench({ url, model, workload: { kind: "doc-qa", documents: 8 }, requests: 200, rate: 20, seed: 1 });
 *   console.log(formatTable(r));
 */
export { type ClientConfig, endpointUrl, sendRequest } from "./client.ts";
export { type CompareRow, compareResults, formatCompare } from "./compare.ts";
export { type Distribution, distribution, PERCENTILE_METHOD, percentile } from "./percentiles.ts";
export { renderPlotHtml } from "./plot.ts";
export { createProgress, type ProgressReporter } from "./progress.ts";
export { formatTable } from "./report.ts";
export { arrivalSchedule, type BenchOptions, runBench } from "./runner.ts";
export {
  type BenchConfigRecord,
  type BenchResult,
  parseResult,
  RECORD_KEYS,
  RESULT_KEYS,
  SCHEMA_VERSION,
  SUMMARY_KEYS,
} from "./schema.ts";
export { type BenchSummary, meetsSlo, type SummarizeOptions, summarize } from "./summary.ts";
export type * from "./types.ts";
export { buildWorkload, parseWorkloadName, type WorkloadSpec } from "./workloads/index.ts";
