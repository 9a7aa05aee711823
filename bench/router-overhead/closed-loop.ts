/**
 * The closed loop gc.ts and warmup.ts drive: `n` short chat completions (`max_tokens` 4) at
 * concurrency 16 on one undici Pool, each body drained. Resolves to the number of failures
 * (errors and non-200 answers).
 */
import { Pool } from "undici";

export async function closedLoop(url: string, n: number, stream: boolean): Promise<number> {
  const pool = new Pool(url, { connections: 16, pipelining: 1 });
  let next = 0;
  let errors = 0;
  const body = (i: number) =>
    JSON.stringify({
      model: "sim-model",
      messages: [{ role: "user", content: `Benchmark request ${i % 64}: say something short.` }],
      max_tokens: 4,
      stream,
    });
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      while (next < n) {
        const i = next++;
        try {
          const r = await pool.request({
            path: "/v1/chat/completions",
            method: "POST",
            headers: { "content-type": "application/json" },
            body: body(i),
          });
          for await (const _ of r.body) {
            // drain
          }
          if (r.statusCode !== 200) errors++;
        } catch {
          errors++;
        }
      }
    }),
  );
  await pool.close();
  return errors;
}
