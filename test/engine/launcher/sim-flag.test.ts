/**
 * `infera engine vllm|sglang|atom --sim`: the simulator in that engine's personality gets
 * exactly the real engine's arguments (everything after its executable words) and
 * environment; only the executable words become `node bin/infera-sim.js --engine <kind>`.
 * The record names the real engine. `infera engine sim` stays the vLLM personality with the
 * sim's own --role/--connector.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { describe, it } from "node:test";
import { promisify } from "node:util";
import type { WorkerRecord } from "../../../src/discovery/types.ts";
import { engineAdapters } from "../../../src/engine/launcher/index.ts";
import { SIM_BIN } from "../../../src/engine/launcher/sim.ts";
import { INFERA_BIN } from "../../helpers/infera.ts";
import { simEngineWords } from "../../helpers/launcher.ts";
import { build } from "./build.ts";

const run = promisify(execFile);

const CASES = [
  { engine: "vllm", flags: { role: "prefill", connector: "mooncake" } },
  { engine: "vllm", flags: { role: "decode", connector: "moriio", moriioProxy: "10.0.0.9" } },
  { engine: "sglang", flags: { role: "decode", connector: "mooncake", tp: "2" } },
  { engine: "atom", flags: { role: "prefill", connector: "moriio", kvCacheDtype: "fp8" } },
  { engine: "atom", flags: {} },
] as const;

describe("--sim", () => {
  for (const c of CASES) {
    it(`${c.engine} ${JSON.stringify(c.flags)}: same args and env as the real engine, sim executable`, async () => {
      const real = await build(c.engine, c.flags, ["--speed", "50"]);
      const sim = await build(c.engine, { ...c.flags, sim: true }, ["--speed", "50"]);
      const words = engineAdapters[c.engine].defaultBin().length;
      assert.deepEqual(sim.cmd.argv.slice(0, 4), [process.execPath, SIM_BIN, "--engine", c.engine]);
      assert.deepEqual(sim.cmd.argv.slice(4), real.cmd.argv.slice(words));
      assert.deepEqual(sim.cmd.env, real.cmd.env);
      assert.equal(sim.record.engine, c.engine);
      assert.deepEqual({ ...sim.record, id: "" }, { ...real.record, id: "" });
    });
  }

  it("is refused with --engine-bin and for the sim kind itself, which keeps its own command line", async () => {
    await assert.rejects(build("vllm", { sim: true, engineBin: "vllm" }), /drop --engine-bin/);
    await assert.rejects(build("sim", { sim: true }), /--sim is for/);
    // `infera engine sim`: the vLLM command line plus the sim's own --role/--connector, as before.
    assert.deepEqual(simEngineWords(), ["engine", "sim"]);
    const { cmd, record } = await build("sim", { role: "decode", connector: "nixl" });
    assert.deepEqual(cmd.argv.slice(1, 4), [SIM_BIN, "serve", "org/model"]);
    assert.ok(cmd.argv.includes("--role") && cmd.argv.includes("--connector"));
    assert.equal(record.engine, "sim");
  });

  it("CLI: `infera engine atom --sim --dry-run` prints the sim command and the atom record", async () => {
    const args = [
      ...simEngineWords("atom"),
      "--model",
      "m",
      "--served-model-name",
      "alias",
      "--port",
      "8123",
      "--advertise-host",
      "10.0.0.7",
      "--dry-run",
      "--",
      "--speed",
      "50",
    ];
    const { stdout } = await run(process.execPath, [INFERA_BIN, ...args], {
      env: { ...process.env, INFERA_LOG_LEVEL: "silent" },
    });
    const out = JSON.parse(stdout) as { argv: string[]; env: Record<string, string>; record: WorkerRecord };
    assert.deepEqual(out.argv.slice(1, 4), [SIM_BIN, "--engine", "atom"]);
    assert.deepEqual(out.argv.slice(4, 8), ["--model", "m", "--served-model-name", "alias"]);
    assert.deepEqual(out.argv.slice(-2), ["--speed", "50"]);
    assert.equal(out.env.ATOM_KV_EVENTS_ENABLE, "1");
    assert.equal(out.record.engine, "atom");
    assert.equal(out.record.kvEvents?.framing, "atom");
    assert.equal(out.record.url, "http://10.0.0.7:8123");
  });
});
