import { freePort } from "./ports.ts";

/**
 * The listen flags an `infera engine ...` launcher is given in tests: HTTP on 127.0.0.1:`port`,
 * KV events and their replay on two more free ports.
 */
export async function engineListenArgs(port: number): Promise<string[]> {
  return [
    "--host",
    "127.0.0.1",
    "--port",
    String(port),
    "--kv-events-port",
    String(await freePort()),
    "--kv-events-replay-port",
    String(await freePort()),
  ];
}
