/**
 * kvd killed with -9 during a write storm (3 writers, chunks of 64–464 KiB landing on L3),
 * then restarted on the same disk directory: no chunk it serves is corrupt or truncated.
 * Same scenario as test/kvd/durability.test.ts (the kvd's own test), here with its figure
 * (chunks written / acknowledged / served after restart / corrupt) for the summary table.
 * Chunks only in L2 (RAM) when the process died are gone by design; only what is served counts.
 */
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { after, test } from "node:test";
import { KvdClient } from "../../src/kvd/client.ts";
import { bytesFor, chunkFilesOnDisk, spawnKvd, tempDir, waitExit } from "../kvd/helpers.ts";
import { fileDone, fileStarted, record } from "./summary.ts";

fileStarted(import.meta.url);
const tmp = tempDir("infera-rel-kvd-");
const children: { kill(sig: NodeJS.Signals): boolean; exitCode: number | null }[] = [];
after(() => {
  for (const c of children) if (c.exitCode === null) c.kill("SIGKILL");
  tmp.cleanup();
  fileDone(import.meta.url);
});

const sizeOf = (i: number): number => 64 * 1024 + ((i * 7919) % 400) * 1024;

test("kvd kill -9 during a write storm: no corrupt chunk served after restart", {
  timeout: 60_000,
}, async () => {
  const dir = tmp.dir;
  const sock = join(dir, "kvd.sock");
  const disk = join(dir, "disk");
  mkdirSync(disk, { recursive: true });
  const args = ["--socket", sock, "--ram-bytes", "32MiB", "--disk-dir", disk, "--disk-bytes", "1GiB"];
  let child = await spawnKvd(args, sock);
  children.push(child);
  const written: string[] = [];
  let acked = 0;
  let stop = false;
  const writers = Array.from({ length: 3 }, async (_, w) => {
    const c = await KvdClient.connect({ socketPath: sock, namespace: "rel-storm" });
    for (let i = 0; !stop; i++) {
      const key = `w${w}-${i}`;
      written.push(key);
      try {
        const [ok] = await c.put([{ key, data: bytesFor(key, sizeOf(i)) }]);
        if (ok) acked++;
      } catch {
        break;
      }
    }
    c.close();
  });
  const filesOnDisk = () => chunkFilesOnDisk(disk);
  const deadline = Date.now() + 20_000;
  while (filesOnDisk() < 40 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  await new Promise((r) => setTimeout(r, 300));
  child.kill("SIGKILL");
  stop = true;
  await waitExit(child);
  await Promise.all(writers);

  child = await spawnKvd(args, sock);
  children.push(child);
  let served = 0;
  let corrupt = 0;
  let truncated = 0;
  const c = await KvdClient.connect({ socketPath: sock, namespace: "rel-storm" });
  try {
    for (let i = 0; i < written.length; i += 32) {
      const batch = written.slice(i, i + 32);
      const got = await c.getCopy(batch);
      got.forEach((b, j) => {
        if (!b) return;
        served++;
        const key = batch[j]!;
        const want = sizeOf(Number(key.split("-")[1]));
        if (b.length !== want) truncated++;
        else if (!b.equals(bytesFor(key, want))) corrupt++;
      });
    }
  } finally {
    c.close();
    child.kill("SIGTERM");
    await waitExit(child);
  }
  const figure =
    `${written.length} chunks written (${acked} acknowledged) when killed; after restart ${served} served ` +
    `from L3, corrupt ${corrupt}, truncated ${truncated}`;
  const pass = corrupt === 0 && truncated === 0 && served > 0 && written.length >= 10;
  record(
    import.meta.url,
    "kvd kill -9 during a write storm",
    figure,
    "0 corrupt, 0 truncated (≥ 10 written, served > 0)",
    pass,
  );
  assert.ok(written.length >= 10, `storm wrote ${written.length} chunks`);
  assert.equal(corrupt, 0);
  assert.equal(truncated, 0);
  assert.ok(served > 0, "some chunks survived on L3");
});
