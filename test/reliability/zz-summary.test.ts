/**
 * Runs last (file order): waits until every reliability file of this run that started has
 * finished, then prints one table of all recorded figures. Fails when a started file never
 * finished or finished without recording a figure (it crashed or was killed), or when a
 * recorded figure missed its goal (the table's FAIL rows).
 */
import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { test } from "node:test";
import { type FigureRecord, fileName, readLines, renderTable, summaryPath } from "./summary.ts";

const SELF = fileName(import.meta.url);
/** The slowest file's budget plus slack; the whole suite should take ≤ ~4 min. */
const WAIT_MS = Number(process.env.INFERA_RELIABILITY_WAIT_MS ?? 150_000);

test("reliability summary", { timeout: WAIT_MS + 10_000 }, async () => {
  // Files start in name order, so by now every other file of this run has started; a short
  // grace covers one that is still booting.
  await new Promise((r) => setTimeout(r, 1000));
  const deadline = Date.now() + WAIT_MS;
  let pending: string[] = [];
  for (;;) {
    const lines = readLines();
    const started = new Set(lines.filter((l) => l.kind === "start").map((l) => l.file));
    const done = new Set(lines.filter((l) => l.kind === "done").map((l) => l.file));
    started.delete(SELF);
    pending = [...started].filter((f) => !done.has(f));
    if (pending.length === 0 || Date.now() > deadline) break;
    await new Promise((r) => setTimeout(r, 500));
  }
  const lines = readLines();
  const figures = lines.filter((l): l is FigureRecord => l.kind === "figure");
  const started = [...new Set(lines.filter((l) => l.kind === "start").map((l) => l.file))];
  const silent = started.filter((f) => f !== SELF && !figures.some((fig) => fig.file === f));
  const missing = [...new Set([...pending, ...silent])];
  console.log(`\n=== Infera reliability summary (${figures.length} figures) ===\n`);
  console.log(renderTable(figures, missing));
  console.log("");
  rmSync(summaryPath(), { force: true });
  if (started.length === 0) {
    // Run on its own: nothing to summarise, and nothing is wrong.
    return;
  }
  assert.deepEqual(missing, [], "every reliability file finished and recorded its figures");
  // The table's PASS/FAIL is each file's own check against its goal; the summary agrees with it.
  // Timing rows (MET/MISS) are figures of the machine as much as of the code: shown, not gating.
  const failed = figures
    .filter((f) => !f.pass && !f.timing)
    .map((f) => `${f.item}: ${f.figure} (goal: ${f.goal})`);
  assert.deepEqual(failed, [], "every recorded figure met its goal");
});
