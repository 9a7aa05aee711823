/**
 * RoCEv2 GID index detection from `show_gids` (Mellanox/ionic format):
 *   DEV     PORT  INDEX  GID                                      IPv4        VER  DEV
 *   mlx5_0  1     3      0000:0000:0000:0000:0000:ffff:0a00:0005  10.0.0.5    v2   enp1s0f0
 * The routable entry is RoCE v2 with an IPv4 address; its index goes to MC_GID_INDEX and
 * NCCL_IB_GID_INDEX. The command is overridable (flag or INFERA_SHOW_GIDS_CMD) for tests.
 */
import { execFile } from "node:child_process";
import { BadRequestError } from "../../protocol/errors.ts";
import { splitCommand } from "./common.ts";

export interface GidEntry {
  device: string;
  port: number;
  index: number;
  gid: string;
  ipv4?: string;
  version: string;
  netdev?: string;
}

const IPV4 = /^\d{1,3}(\.\d{1,3}){3}$/;

export function parseShowGids(output: string): GidEntry[] {
  const out: GidEntry[] = [];
  for (const line of output.split("\n")) {
    const f = line.trim().split(/\s+/);
    if (f.length < 5) continue;
    const [device, portS, indexS, gid] = f as [string, string, string, string];
    if (!/^\d+$/.test(portS) || !/^\d+$/.test(indexS) || !gid.includes(":")) continue;
    let i = 4;
    const ipv4 = f[i] !== undefined && IPV4.test(f[i] as string) ? f[i++] : undefined;
    const version = f[i++] ?? "";
    if (!/^v\d$/i.test(version)) continue;
    out.push({
      device,
      port: Number(portS),
      index: Number(indexS),
      gid,
      ipv4,
      version: version.toLowerCase(),
      netdev: f[i],
    });
  }
  return out;
}

function describe(e: GidEntry): string {
  return `${e.device} port ${e.port} index ${e.index} ${e.version} ${e.ipv4 ?? "(no IPv4)"}`;
}

/** The first RoCE v2 entry with an IPv4 address (on `device` when given); throws naming what it saw. */
export function pickGidIndex(entries: readonly GidEntry[], device?: string): GidEntry {
  const pool = device ? entries.filter((e) => e.device === device) : entries;
  const hit = pool.find((e) => e.version === "v2" && e.ipv4 !== undefined && e.ipv4 !== "0.0.0.0");
  if (hit) return hit;
  const saw = entries.length === 0 ? "no GID entries at all" : `saw: ${entries.map(describe).join("; ")}`;
  const where = device ? ` on device ${device}` : "";
  throw new BadRequestError(
    `--gid-index auto: no RoCEv2 GID with an IPv4 address${where} in show_gids output (${saw})`,
    "gid-index",
  );
}

export function runShowGids(command: string, timeoutMs = 10_000): Promise<string> {
  const [bin, ...args] = splitCommand(command);
  if (!bin) return Promise.reject(new BadRequestError("--show-gids-cmd is empty", "show-gids-cmd"));
  return new Promise((resolve, reject) => {
    execFile(bin, args, { timeout: timeoutMs, maxBuffer: 4 * 1024 * 1024 }, (err, stdout) => {
      if (err) {
        reject(
          new BadRequestError(`--gid-index auto: running '${command}' failed: ${err.message}`, "gid-index"),
        );
      } else resolve(stdout);
    });
  });
}

export async function detectGidIndex(command: string, device?: string): Promise<GidEntry> {
  return pickGidIndex(parseShowGids(await runShowGids(command)), device);
}
