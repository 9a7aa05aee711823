import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { freePort } from "../../helpers/ports.ts";
import { parseMetric, type SimProcess, startSim } from "../../helpers/sim.ts";

// SGLang bootstrap: the identical body (with bootstrap_host/port/room at the top level) goes to
// P and D at once; D's answer is the client's. Exercises the core's PD hooks for a protocol
// without kv_transfer_params (connector internals: test/engine/sim-pd).
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
      startSim({ args: ["--speed", "20", "--role", "decode", "--connector", "sglang"] }),
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
});
