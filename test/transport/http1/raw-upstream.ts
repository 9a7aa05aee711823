/**
 * Raw `net` upstreams for the HTTP/1.1 client's tests: each reads request heads (and
 * Content-Length bodies) by hand and hands every request to a callback that writes whatever
 * bytes the test wants; counts connections, requests and closes. Closed after the file's tests.
 */
import net from "node:net";
import { after } from "node:test";
import type { WorkerState } from "../../../src/router/types.ts";
import { HttpExecutor } from "../../../src/transport/http.ts";
import { mixedRecord } from "../../helpers/records.ts";

/** What the upstream does with each request: `n` counts requests on this connection (1-based). */
export type OnRequest = (sock: net.Socket, n: number, head: string) => void;

export interface Upstream {
  url: string;
  worker: WorkerState;
  /** Connections accepted so far. */
  conns: number;
  /** Requests seen so far. */
  requests: number;
  /** Connections the client closed. */
  closed: number;
  close(): Promise<void>;
}

const servers: Upstream[] = [];
after(async () => {
  for (const s of servers) await s.close();
});

/** A raw upstream: reads request heads (and Content-Length bodies) and hands each to `on`. */
export async function upstream(on: OnRequest): Promise<Upstream> {
  const socks = new Set<net.Socket>();
  const u = { conns: 0, requests: 0, closed: 0 } as Upstream;
  const server = net.createServer((sock) => {
    u.conns++;
    socks.add(sock);
    // Each write its own packet, as an engine's event stream is (Nagle would batch them).
    sock.setNoDelay(true);
    sock.on("close", () => {
      u.closed++;
      socks.delete(sock);
    });
    sock.on("error", () => {});
    let buf = Buffer.alloc(0);
    let n = 0;
    sock.on("data", (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      for (;;) {
        const end = buf.indexOf("\r\n\r\n");
        if (end < 0) return;
        const head = buf.toString("latin1", 0, end);
        const len = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
        if (buf.length < end + 4 + len) return;
        buf = buf.subarray(end + 4 + len);
        u.requests++;
        on(sock, ++n, head);
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  u.url = `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`;
  u.worker = { record: mixedRecord({ id: "w", model: "m", url: u.url }) } as unknown as WorkerState;
  u.close = async () => {
    for (const s of socks) s.destroy();
    await new Promise<void>((r) => server.close(() => r()));
  };
  servers.push(u);
  return u;
}

export const exec = new HttpExecutor();
after(() => exec.close());

export const send = (
  u: Upstream,
  ex = exec,
  timeoutMs?: number,
  signal: AbortSignal = new AbortController().signal,
) => ex.send(u.worker, "chat", { model: "m" }, { signal, timeoutMs });

export const text = async (body: AsyncIterable<Uint8Array>): Promise<string> => {
  let s = "";
  for await (const c of body) s += Buffer.from(c).toString("latin1");
  return s;
};

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export const SSE =
  "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" +
  "9\r\ndata: 1\n\n\r\nE\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
