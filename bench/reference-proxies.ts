/**
 * The reference proxies the benches measure infera against, shared by bench/router-overhead and
 * bench/fleet-scale/proxy-floor.ts so both price the same nginx and the same bare Node proxy.
 */
import { fileURLToPath } from "node:url";

export interface NginxOptions {
  /** nginx's prefix directory: pid, error log and temp paths go there. */
  dir: string;
  port: number;
  /** Upstream `host:port`s, taken round-robin. */
  upstreams: readonly string[];
  /**
   * Idle upstream connections nginx keeps per worker, all upstreams together (LRU). Below the
   * number of upstreams, a round-robin over them evicts each connection before its next turn.
   */
  keepalive: number;
  workerConnections: number;
}

/** nginx `proxy_pass` with one worker process, keep-alive both sides, no buffering, no access log. */
export function nginxConf(o: NginxOptions): string {
  const { dir } = o;
  const servers = o.upstreams.map((u) => `server ${u};`).join(" ");
  return `worker_processes 1;
daemon off;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections ${o.workerConnections}; }
http {
  access_log off;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  upstream backends { ${servers} keepalive ${o.keepalive}; }
  server {
    listen 127.0.0.1:${o.port};
    keepalive_requests 1000000;
    location / {
      proxy_pass http://backends;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`;
}

/**
 * A bare node:http + undici proxy (no validation, routing state or metrics): the floor for any
 * Node.js gateway on this machine. Run as `node FILE PORT CONNECTIONS URL...`: one undici Pool
 * of CONNECTIONS per upstream URL, requests round-robin over them.
 */
export const BARE_PROXY = `
import http from "node:http";
import { Pool } from ${JSON.stringify(fileURLToPath(new URL("../node_modules/undici/index.js", import.meta.url)))};
const [port, connections, ...upstreams] = process.argv.slice(2);
const pools = upstreams.map((u) => new Pool(u, { connections: Number(connections) }));
let next = 0;
http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", async () => {
    try {
      const pool = pools[next++ % pools.length];
      const r = await pool.request({ path: req.url, method: req.method, headers: { "content-type": "application/json" }, body: req.method === "POST" ? Buffer.concat(chunks) : undefined });
      res.writeHead(r.statusCode, { "content-type": r.headers["content-type"] ?? "application/json" });
      r.body.on("data", (c) => res.write(c));
      r.body.on("end", () => res.end());
      r.body.on("error", () => res.destroy());
    } catch { res.destroy(); }
  });
}).listen(Number(port), "127.0.0.1");
`;
