import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { freePort } from "../../helpers/ports.ts";
import { parseMetric, type SimProcess, startSim } from "../../helpers/sim.ts";

// SGLang bootstrap: the identical body (with bootstrap_host/port/room at the top level) goes to
// P and D at once; D's answer is the client's. Exercises the core's PD hooks for a protocol
// without kv_transfer_params (connector internals: test/engine/sim/pd).
describe("sim PD end to end (sglang bootstrap, concurrent, two processes)", () => {
  let p: SimProcess;
  let d: SimProcess;
  let port: number;

  before(async () => {
    port = await freePort();
    [p, d] = await Promise.all([
      startSim({
        args: ["--speed", "20", "--role", "prefill", "--connector", "sglang"],
        env: { SGLANG_DISAGGREGATION_BOOTSTRAP_PORT: String(port) },
      }),
      startSim({
        args: ["--speed", "20", "--role", "decode", "--connector", "sglang"],
        env: { INFERA_SIM_KV_PULL_TIMEOUT_MS: "1500" },
      }),
    ]);
  });
  after(async () => {
    await Promise.all([p?.stop(), d?.stop()]);
  });

  it("identical bodies to P and D: D streams the answer and computes only the last prompt token", async () => {
    const body = JSON.stringify({
      model: "sim-model",
      messages: [{ role: "user", content: "Summarise the bootstrap protocol. ".repeat(25) }],
      max_tokens: 8,
      stream: true,
      stream_options: { include_usage: true },
      bootstrap_host: "127.0.0.1",
      bootstrap_port: port,
      bootstrap_room: 1234567,
    });
    const post = (url: string) =>
      fetch(`${url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-request-id": "sg-1" },
        body,
      });
    const [pr, dr] = await Promise.all([post(p.url), post(d.url)]);
    assert.equal(pr.status, 200);
    assert.equal(dr.status, 200);
    await pr.text();
    const text = await dr.text();
    assert.ok(text.endsWith("data: [DONE]\n\n"));
    const usageLine = text.split("\n\n").find((l) => l.includes('"usage"'));
    const usage = (
      JSON.parse(usageLine!.slice(6)) as { usage: { prompt_tokens: number; completion_tokens: number } }
    ).usage;
    assert.equal(usage.completion_tokens, 8);
    const dm = await d.metrics();
    assert.equal(
      parseMetric(dm, "vllm:prompt_tokens_by_source_total", { source: "external_kv_transfer" }),
      usage.prompt_tokens - 1,
    );
    assert.equal(parseMetric(dm, "vllm:prompt_tokens_by_source_total", { source: "local_compute" }), 1);
  });

  // SGLang normalizes batch rooms (python/sglang/srt/managers/io_struct.py
  // _normalize_bootstrap_params): a scalar room is room + i per item; D waits for every item's room
  // (sgl-project/sglang python/sglang/srt/disaggregation/common/conn.py @ 0094505da74125a31ceb354f37ae7a1b6a97d3f5).
  it("a list prompt with one scalar room: every item's room (room + i) moves; rooms P never fills fail D", async () => {
    const post = (url: string, id: string, room: unknown) =>
      fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-request-id": id },
        body: JSON.stringify({
          model: "sim-model",
          prompt: ["First batch item about transfers. ".repeat(10), "Second batch item. ".repeat(10)],
          max_tokens: 4,
          bootstrap_host: "127.0.0.1",
          bootstrap_port: port,
          bootstrap_room: room,
        }),
      });
    const [pr, dr] = await Promise.all([post(p.url, "sg-b1", 5000), post(d.url, "sg-b1", 5000)]);
    assert.equal(pr.status, 200, await pr.clone().text());
    assert.equal(dr.status, 200, await dr.clone().text());
    const dBody = (await dr.json()) as { choices: unknown[] };
    assert.equal(dBody.choices.length, 2);
    // P's items carry rooms [6000, 6002]; D waits for [6000, 6001]: the second never arrives.
    const [pr2, dr2] = await Promise.all([post(p.url, "sg-b2", [6000, 6002]), post(d.url, "sg-b2", 6000)]);
    assert.equal(pr2.status, 200);
    assert.equal(dr2.status, 504, await dr2.clone().text());
    assert.equal(parseMetric(await d.metrics(), "vllm:num_requests_running"), 0);
  });
});
