/**
 * kvBlocks for the record: `--num-gpu-blocks-override` (vLLM's flag) when given, else what
 * the healthy engine reports — vLLM's `vllm:cache_config_info` gauge carries the pool in its
 * `num_gpu_blocks` label (vllm-project/vllm vllm/v1/metrics/loggers.py @
 * a6f0308cfe806b7731ad4979c9bea6e470c35efd `_log_info_cache_config`: labels from
 * `CacheConfig.metrics_info()` plus `engine`, one sample per engine index); SGLang's server info
 * carries `max_total_num_tokens` (python/sglang/srt/managers/data_parallel_controller.py @
 * 000a3db1c0c42140f14ddab7b4c6dda86de1fa4b collects it from the schedulers).
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, describe, it } from "node:test";
import { promisify } from "node:util";
import type { WorkerRecord } from "../../../src/discovery/types.ts";
import {
  blocksOverride,
  parseVllmCacheBlocks,
  reportedKvBlocks,
} from "../../../src/engine/launcher/facts.ts";
import { INFERA_BIN } from "../../helpers/infera.ts";
import { build } from "./build.ts";

const METRICS = [
  "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
  "# TYPE vllm:cache_config_info gauge",
  'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="9000",num_gpu_blocks_override="None"} 1.0',
  'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",num_gpu_blocks="8700",num_gpu_blocks_override="None"} 1.0',
].join("\n");

describe("kvBlocks", () => {
  const servers: Server[] = [];
  after(() => {
    for (const s of servers) s.close();
  });

  async function serve(routes: Record<string, string>): Promise<string> {
    const srv = createServer((req, res) => {
      const body = routes[req.url ?? ""];
      res.writeHead(body === undefined ? 404 : 200).end(body ?? "");
    });
    servers.push(srv);
    await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
    return `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
  }

  it("parses the override flag in both spellings and the smallest per-rank pool", () => {
    assert.equal(blocksOverride(["--enforce-eager", "--num-gpu-blocks-override", "512"]), 512);
    assert.equal(blocksOverride(["--num-gpu-blocks-override=64"]), 64);
    assert.equal(blocksOverride(["--num-gpu-blocks", "64"]), undefined);
    assert.equal(parseVllmCacheBlocks(METRICS), 8700);
    assert.equal(parseVllmCacheBlocks("vllm:num_requests_running 0"), undefined);
  });

  it("reads vLLM /metrics and SGLang server info over HTTP; ATOM reports none", async () => {
    const vllm = await build("vllm");
    assert.equal(await reportedKvBlocks(vllm.spec, await serve({ "/metrics": METRICS }), 16), 8700);
    const sglang = await build("sglang", { blockSize: "16" });
    const sgBase = await serve({ "/get_server_info": JSON.stringify({ max_total_num_tokens: 160000 }) });
    assert.equal(await reportedKvBlocks(sglang.spec, sgBase, 16), 10000);
    const atom = await build("atom");
    assert.equal(await reportedKvBlocks(atom.spec, await serve({ "/metrics": METRICS }), 16), undefined);
    const flagged = await build("vllm", {}, ["--num-gpu-blocks-override", "77"]);
    assert.equal(await reportedKvBlocks(flagged.spec, "http://127.0.0.1:1", 16), 77);
  });

  it("dry run: the record preview carries kvBlocks from the override and every DP rank", async () => {
    const { stdout } = await promisify(execFile)(
      process.execPath,
      [
        INFERA_BIN,
        "engine",
        "vllm",
        "--model",
        "m",
        "--dp",
        "2",
        "--advertise-host",
        "10.0.0.7",
        "--dry-run",
        "--",
        "--num-gpu-blocks-override",
        "500",
      ],
      { env: { ...process.env, INFERA_LOG_LEVEL: "silent" } },
    );
    const { record } = JSON.parse(stdout) as { record: WorkerRecord };
    assert.equal(record.kvBlocks, 500);
    assert.deepEqual(
      record.kvEvents?.ranks?.map((r) => r.replayEndpoint),
      ["tcp://10.0.0.7:5559", "tcp://10.0.0.7:5560"],
    );
  });
});
