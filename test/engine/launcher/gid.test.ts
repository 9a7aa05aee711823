import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { detectGidIndex, parseShowGids, pickGidIndex } from "../../../src/engine/launcher/gid.ts";
import { buildLaunchSpec } from "../../../src/engine/launcher/options.ts";

// Real show_gids layout (Mellanox OFED / AMD ionic): v1 and v2 per GID, link-local first.
const SHOW_GIDS = `DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4  \t\tVER\tDEV
---\t----\t-----\t---\t\t\t\t\t------------  \t---\t---
ionic_0\t1\t0\tfe80:0000:0000:0000:0ac0:ebff:fe1f:5e5a\t\t\tv1\tenp9s0
ionic_0\t1\t1\tfe80:0000:0000:0000:0ac0:ebff:fe1f:5e5a\t\t\tv2\tenp9s0
ionic_0\t1\t2\t0000:0000:0000:0000:0000:ffff:0a00:0005\t10.0.0.5  \tv1\tenp9s0
ionic_0\t1\t3\t0000:0000:0000:0000:0000:ffff:0a00:0005\t10.0.0.5  \tv2\tenp9s0
ionic_1\t1\t0\tfe80:0000:0000:0000:0ac0:ebff:fe1f:5e5b\t\t\tv1\tenp10s0
ionic_1\t1\t1\tfe80:0000:0000:0000:0ac0:ebff:fe1f:5e5b\t\t\tv2\tenp10s0
ionic_1\t1\t2\t0000:0000:0000:0000:0000:ffff:0a00:0105\t10.0.1.5  \tv1\tenp10s0
ionic_1\t1\t5\t0000:0000:0000:0000:0000:ffff:0a00:0105\t10.0.1.5  \tv2\tenp10s0
n_gids_found=8
`;

const LINK_LOCAL_ONLY = `DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4  \t\tVER\tDEV
mlx5_0\t1\t0\tfe80:0000:0000:0000:0ac0:ebff:fe1f:5e5a\t\t\tv1\tenp1s0
mlx5_0\t1\t1\tfe80:0000:0000:0000:0ac0:ebff:fe1f:5e5a\t\t\tv2\tenp1s0
mlx5_0\t1\t2\t0000:0000:0000:0000:0000:ffff:0a00:0005\t10.0.0.5  \tv1\tenp1s0
n_gids_found=3
`;

describe("show_gids parsing", () => {
  const dir = mkdtempSync(join(tmpdir(), "infera-gids-"));
  after(() => rmSync(dir, { recursive: true, force: true }));
  const canned = (name: string, text: string) => {
    const p = join(dir, name);
    writeFileSync(p, text);
    return `cat ${p}`;
  };

  it("parses every row, with and without IPv4", () => {
    const e = parseShowGids(SHOW_GIDS);
    assert.equal(e.length, 8);
    assert.deepEqual(e[3], {
      device: "ionic_0",
      port: 1,
      index: 3,
      gid: "0000:0000:0000:0000:0000:ffff:0a00:0005",
      ipv4: "10.0.0.5",
      version: "v2",
      netdev: "enp9s0",
    });
    assert.equal(e[1]?.ipv4, undefined);
  });

  it("picks the first RoCEv2 entry with an IPv4 address, per device when asked", () => {
    assert.equal(pickGidIndex(parseShowGids(SHOW_GIDS)).index, 3);
    assert.equal(pickGidIndex(parseShowGids(SHOW_GIDS), "ionic_1").index, 5);
  });

  it("fails naming what it saw", () => {
    assert.throws(
      () => pickGidIndex(parseShowGids(LINK_LOCAL_ONLY)),
      (err: Error) =>
        /no RoCEv2 GID with an IPv4 address/.test(err.message) &&
        err.message.includes("mlx5_0 port 1 index 1 v2 (no IPv4)") &&
        err.message.includes("index 2 v1 10.0.0.5"),
    );
    assert.throws(() => pickGidIndex([]), /no GID entries at all/);
  });

  it("runs the (overridable) command and feeds MC_GID_INDEX through --gid-index auto", async () => {
    const cmd = canned("gids.txt", SHOW_GIDS);
    assert.equal((await detectGidIndex(cmd)).index, 3);
    const spec = await buildLaunchSpec(
      "vllm",
      {
        model: "m",
        gidIndex: "auto",
        showGidsCmd: cmd,
        ibDevice: "ionic_1",
        role: "prefill",
        connector: "mooncake",
      },
      [],
    );
    assert.equal(spec.gidIndex, 5);
    const bad = canned("bad.txt", LINK_LOCAL_ONLY);
    await assert.rejects(
      buildLaunchSpec("vllm", { model: "m", gidIndex: "auto", showGidsCmd: bad }, []),
      /saw: mlx5_0/,
    );
    await assert.rejects(
      buildLaunchSpec("vllm", { model: "m", gidIndex: "auto", showGidsCmd: "/nonexistent/show_gids" }, []),
      /running '\/nonexistent\/show_gids' failed/,
    );
  });
});
