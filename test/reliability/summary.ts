/**
 * The reliability suite's shared summary. Each test file records its figures with `record()`
 * (one JSON line appended to a file under os.tmpdir()) and calls `fileStarted()`/`fileDone()`;
 * `zz-summary.test.ts` waits for every started file to finish and prints one table.
 *
 * The files of one run share a run id: the pid of the test runner that spawned them (every
 * test file runs in its own child process of `node --test`), or INFERA_RELIABILITY_RUN.
 */
import { appendFileSync, existsSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";

export interface FigureRecord {
  kind: "figure";
  file: string;
  item: string;
  /** What was measured, in words, e.g. "lost 0, retried 7, failed 0 (32 requests)". */
  figure: string;
  /** The goal it is held to, e.g. "lost = 0". */
  goal: string;
  pass: boolean;
  /**
   * A latency goal measured on whatever machine runs the suite (2 shared cores in CI, other
   * test files running beside it): shown as MET/MISS and never failing the run. The same
   * file records a gating row for the property behind it (e.g. "no freeze").
   */
  timing?: boolean;
}

interface MarkRecord {
  kind: "start" | "done";
  file: string;
}

type Line = FigureRecord | MarkRecord;

export function runId(): string {
  return process.env.INFERA_RELIABILITY_RUN ?? String(process.ppid);
}

export function summaryPath(id = runId()): string {
  return join(tmpdir(), `infera-reliability-${id}.jsonl`);
}

function append(line: Line): void {
  appendFileSync(summaryPath(), `${JSON.stringify(line)}\n`);
}

export const fileName = (metaUrl: string): string => basename(new URL(metaUrl).pathname);

export function fileStarted(metaUrl: string): void {
  append({ kind: "start", file: fileName(metaUrl) });
}

export function fileDone(metaUrl: string): void {
  append({ kind: "done", file: fileName(metaUrl) });
}

const verdict = (f: Pick<FigureRecord, "pass" | "timing">): string =>
  f.timing ? (f.pass ? "MET" : "MISS") : f.pass ? "PASS" : "FAIL";

/** Prints the figure and records it for the table; returns `pass` so callers can assert on it. */
export function record(
  metaUrl: string,
  item: string,
  figure: string,
  goal: string,
  pass: boolean,
  opts: { timing?: boolean } = {},
): boolean {
  const rec: FigureRecord = { kind: "figure", file: fileName(metaUrl), item, figure, goal, pass };
  if (opts.timing) rec.timing = true;
  console.log(`[reliability] ${item}: ${figure} (goal: ${goal}) ${verdict(rec)}`);
  append(rec);
  return pass;
}

export function readLines(id = runId()): Line[] {
  const p = summaryPath(id);
  if (!existsSync(p)) return [];
  const out: Line[] = [];
  for (const l of readFileSync(p, "utf8").split("\n")) {
    if (l.trim() === "") continue;
    try {
      out.push(JSON.parse(l) as Line);
    } catch {
      // a torn line from a crashed writer: skip it
    }
  }
  return out;
}

/** Splits text into lines of at most `width` characters, at "; " or spaces where possible. */
function wrap(text: string, width: number): string[] {
  const out: string[] = [];
  let rest = text;
  while (rest.length > width) {
    let cut = rest.lastIndexOf("; ", width);
    if (cut > width / 2) cut += 1;
    else cut = rest.lastIndexOf(" ", width);
    if (cut <= 0) cut = width;
    out.push(rest.slice(0, cut).trimEnd());
    rest = rest.slice(cut).trimStart();
  }
  out.push(rest);
  return out;
}

/** Fixed-width text table; long figures wrap onto continuation lines. */
export function renderTable(figures: FigureRecord[], missing: string[], figureWidth = 88): string {
  const rows = figures.map((f) => [verdict(f), f.item, f.figure, f.goal]);
  for (const m of missing) rows.push(["FAIL", m, "no figure (the file crashed or timed out)", "-"]);
  const head = ["", "item", "figure", "goal"];
  const cells = rows.map((r) => [[r[0]!], [r[1]!], wrap(r[2]!, figureWidth), wrap(r[3]!, 40)]);
  const widths = head.map((h, i) =>
    Math.max(h.length, ...cells.map((c) => Math.max(...c[i]!.map((l) => l.length)))),
  );
  const fmt = (r: string[]) => r.map((c, i) => c.padEnd(widths[i]!)).join(" | ");
  const sep = widths.map((w) => "-".repeat(w)).join("-+-");
  const lines = [fmt(head), sep];
  for (const c of cells) {
    const height = Math.max(...c.map((col) => col.length));
    for (let k = 0; k < height; k++) lines.push(fmt(c.map((col) => col[k] ?? "")));
  }
  return lines.join("\n");
}
