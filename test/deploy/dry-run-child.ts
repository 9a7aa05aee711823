/**
 * Child process for dry-run.ts: runs each given command line through buildProgram() with
 * `--dry-run` and prints one JSON array of results. A child because the launcher prints to
 * stdout, where the parent's test runner also reports.
 */
import { buildProgram } from "../../src/cli/main.ts";

interface Job {
  args: string[];
  env: Record<string, string>;
}

const jobs = JSON.parse(process.argv[2]!) as Job[];
const results: ({ ok: true; out: unknown } | { ok: false; error: string })[] = [];
const write = process.stdout.write.bind(process.stdout);
const errWrite = process.stderr.write.bind(process.stderr);
for (const job of jobs) {
  const saved = { ...process.env };
  Object.assign(process.env, job.env);
  let out = "";
  let err = "";
  process.stdout.write = ((c: string | Uint8Array) => {
    out += String(c);
    return true;
  }) as typeof process.stdout.write;
  process.stderr.write = ((c: string | Uint8Array) => {
    err += String(c);
    return true;
  }) as typeof process.stderr.write;
  process.exitCode = 0;
  try {
    const program = buildProgram().exitOverride();
    for (const sub of program.commands) sub.exitOverride();
    await program.parseAsync(["node", "infera", ...job.args]);
  } catch (e) {
    err += String(e);
    process.exitCode = 2;
  } finally {
    process.stdout.write = write;
    process.stderr.write = errWrite;
    process.env = saved;
  }
  if (process.exitCode !== 0) results.push({ ok: false, error: err.trim() });
  else results.push({ ok: true, out: JSON.parse(out) });
  process.exitCode = 0;
}
write(`${JSON.stringify(results)}\n`);
