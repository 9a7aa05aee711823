/**
 * A test double of the Kubernetes API server, written from the API reference, serving only what
 * the operator uses: discovery (APIResourceList per group/version), list + watch of
 * InferaClusters (chunked JSON watch events), GET/list of owned kinds with labelSelector,
 * server-side apply (PATCH, Content-Type application/apply-patch+yaml, fieldManager required),
 * DELETE, and merge-patch of the status subresource. Objects are stored whole (apply replaces
 * rather than merging field ownership). Every request is recorded for assertions.
 */
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { parse } from "yaml";
import { CRD_GROUP, CRD_KIND, CRD_PLURAL, CRD_VERSION } from "../../src/deploy/crd.ts";
import { apiPrefix, type KindInfo, OWNED_KINDS } from "../../src/operator/kinds.ts";

// biome-ignore lint/suspicious/noExplicitAny: stored objects are arbitrary JSON
type Obj = Record<string, any>;

export interface Recorded {
  method: string;
  path: string;
  query: Record<string, string>;
  contentType?: string;
  body?: Obj;
}

const CR_KIND: KindInfo = { apiVersion: `${CRD_GROUP}/${CRD_VERSION}`, kind: CRD_KIND, plural: CRD_PLURAL };
const KINDS = [...OWNED_KINDS, CR_KIND];

export class FakeApiServer {
  readonly requests: Recorded[] = [];
  /** key: plural/namespace/name */
  readonly store = new Map<string, Obj>();
  private rv = 1;
  private readonly watchers = new Set<ServerResponse>();
  private server?: Server;
  url = "";
  /** Kinds answered 404 (e.g. no Prometheus Operator installed). */
  readonly missingGroups = new Set<string>();
  /**
   * RBAC of the caller, when set: `allowed(verb, plural)` as the RBAC authorizer decides it for
   * the operator's ServiceAccount (a test builds it from deploy/operator.yaml's rules). A denied
   * request gets the API server's 403.
   */
  allowed?: (verb: string, plural: string) => boolean;

  async start(): Promise<void> {
    this.server = createServer((req, res) => {
      this.handle(req, res).catch((err) => this.send(res, 500, status(500, String(err))));
    });
    await new Promise<void>((r) => this.server!.listen(0, "127.0.0.1", r));
    this.url = `http://127.0.0.1:${(this.server!.address() as AddressInfo).port}`;
  }

  async close(): Promise<void> {
    for (const w of this.watchers) w.end();
    this.server?.closeAllConnections();
    await new Promise<void>((r) => this.server!.close(() => r()));
  }

  get(kind: string, namespace: string, name: string): Obj | undefined {
    const k = KINDS.find((x) => x.kind === kind)!;
    return this.store.get(`${k.plural}/${namespace}/${name}`);
  }

  /** What a user's `kubectl apply` / `kubectl delete` of the custom resource does. */
  putCluster(obj: Obj): Obj {
    const key = `${CRD_PLURAL}/${obj.metadata.namespace}/${obj.metadata.name}`;
    const old = this.store.get(key);
    const next = {
      ...obj,
      apiVersion: CR_KIND.apiVersion,
      kind: CRD_KIND,
      metadata: {
        ...obj.metadata,
        uid: old?.metadata.uid ?? randomUUID(),
        generation: (old?.metadata.generation ?? 0) + 1,
        resourceVersion: String(++this.rv),
      },
      status: old?.status,
    };
    this.store.set(key, next);
    this.emit(old ? "MODIFIED" : "ADDED", next);
    return next;
  }

  deleteCluster(namespace: string, name: string): void {
    const key = `${CRD_PLURAL}/${namespace}/${name}`;
    const old = this.store.get(key)!;
    this.store.delete(key);
    this.emit("DELETED", old);
  }

  /** What the StatefulSet/Deployment controllers do when pods become ready. */
  setReady(kind: string, namespace: string, name: string, ready: number): void {
    const o = this.get(kind, namespace, name)!;
    o.status = { ...o.status, readyReplicas: ready };
    o.metadata.resourceVersion = String(++this.rv);
  }

  private emit(type: string, object: Obj): void {
    for (const w of this.watchers) w.write(`${JSON.stringify({ type, object })}\n`);
  }

  private send(res: ServerResponse, code: number, body: unknown): void {
    res.writeHead(code, { "content-type": "application/json" });
    res.end(JSON.stringify(body));
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const u = new URL(req.url!, "http://x");
    const query = Object.fromEntries(u.searchParams);
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const text = Buffer.concat(chunks).toString("utf8");
    const contentType = req.headers["content-type"];
    // apply-patch+yaml bodies are YAML (JSON is YAML too).
    const body = text === "" ? undefined : (parse(text) as Obj);
    this.requests.push({ method: req.method!, path: u.pathname, query, contentType, body });
    const path = u.pathname;

    // Discovery: GET /api/v1, /apis/<group>/<version>.
    const disc = KINDS.filter((k) => apiPrefix(k.apiVersion) === path);
    if (req.method === "GET" && disc.length > 0) {
      if (this.missingGroups.has(disc[0]!.apiVersion)) return this.send(res, 404, status(404, "not found"));
      return this.send(res, 200, {
        kind: "APIResourceList",
        apiVersion: "v1",
        groupVersion: disc[0]!.apiVersion,
        resources: disc.flatMap((k) => [
          {
            name: k.plural,
            singularName: "",
            namespaced: true,
            kind: k.kind,
            verbs: ["get", "list", "watch", "patch", "delete"],
          },
          ...(k === CR_KIND
            ? [
                {
                  name: `${k.plural}/status`,
                  singularName: "",
                  namespaced: true,
                  kind: k.kind,
                  verbs: ["get", "patch"],
                },
              ]
            : []),
        ]),
      });
    }
    // Cluster-wide list/watch of the custom resource.
    if (path === `/apis/${CRD_GROUP}/${CRD_VERSION}/${CRD_PLURAL}` && req.method === "GET") {
      if (query.watch === "true") {
        res.writeHead(200, { "content-type": "application/json", "transfer-encoding": "chunked" });
        res.flushHeaders();
        this.watchers.add(res);
        res.on("close", () => this.watchers.delete(res));
        return;
      }
      const items = [...this.store.entries()]
        .filter(([k]) => k.startsWith(`${CRD_PLURAL}/`))
        .map(([, v]) => v);
      return this.send(res, 200, {
        apiVersion: CR_KIND.apiVersion,
        kind: `${CRD_KIND}List`,
        metadata: { resourceVersion: String(this.rv) },
        items,
      });
    }
    // Namespaced: <prefix>/namespaces/<ns>/<plural>[/<name>[/status]]
    const m = /^(.*)\/namespaces\/([^/]+)\/([^/]+)(?:\/([^/]+))?(?:\/(status))?$/.exec(path);
    const kind = m && KINDS.find((k) => apiPrefix(k.apiVersion) === m[1] && k.plural === m[3]);
    if (!m || !kind) return this.send(res, 404, status(404, `no route ${req.method} ${path}`));
    if (this.missingGroups.has(kind.apiVersion)) return this.send(res, 404, status(404, "not found"));
    const [, , ns, plural, name, sub] = m as unknown as [
      string,
      string,
      string,
      string,
      string | undefined,
      string | undefined,
    ];
    const key = `${plural}/${ns}/${name}`;
    const verb =
      req.method === "GET"
        ? name === undefined
          ? query.watch === "true"
            ? "watch"
            : "list"
          : "get"
        : req.method === "POST"
          ? "create"
          : req.method === "PATCH"
            ? "patch"
            : req.method === "DELETE"
              ? "delete"
              : "";
    const res403 = () =>
      this.send(res, 403, status(403, `${plural} is forbidden: cannot ${verb} resource "${plural}"`));
    if (this.allowed && !this.allowed(verb, sub ? `${plural}/${sub}` : plural)) return res403();
    // Server-side apply of an object that does not exist yet also needs `create`.
    if (this.allowed && verb === "patch" && !sub && !this.store.has(key) && !this.allowed("create", plural))
      return res403();
    if (req.method === "POST" && name === undefined) {
      const k2 = `${plural}/${ns}/${body?.metadata?.name}`;
      if (this.store.has(k2))
        return this.send(res, 409, {
          ...status(409, `${plural} "${body?.metadata?.name}" already exists`),
          reason: "AlreadyExists",
        });
      const next = {
        ...body,
        metadata: { ...body?.metadata, namespace: ns, uid: randomUUID(), resourceVersion: String(++this.rv) },
      };
      this.store.set(k2, next);
      return this.send(res, 201, next);
    }
    if (req.method === "GET" && name === undefined) {
      const sel = (query.labelSelector ?? "")
        .split(",")
        .filter(Boolean)
        .map((p) => p.split("=") as [string, string]);
      const items = [...this.store.entries()]
        .filter(([k]) => k.startsWith(`${plural}/${ns}/`))
        .map(([, v]) => v)
        .filter((o) => sel.every(([lk, lv]) => o.metadata.labels?.[lk] === lv))
        // List items come without apiVersion/kind, as from the real server's typed lists.
        .map(({ apiVersion: _a, kind: _k, ...rest }) => rest);
      return this.send(res, 200, {
        apiVersion: kind.apiVersion,
        kind: `${kind.kind}List`,
        metadata: { resourceVersion: String(this.rv) },
        items,
      });
    }
    if (req.method === "GET" && name !== undefined) {
      const o = this.store.get(key);
      return o ? this.send(res, 200, o) : this.send(res, 404, status(404, `${plural} "${name}" not found`));
    }
    if (req.method === "PATCH" && sub === "status") {
      if (contentType !== "application/merge-patch+json")
        return this.send(res, 415, status(415, `unsupported media type ${contentType}`));
      const o = this.store.get(key);
      if (!o) return this.send(res, 404, status(404, "not found"));
      // The status subresource ignores everything but .status.
      o.status = body?.status;
      o.metadata.resourceVersion = String(++this.rv);
      this.emit("MODIFIED", o);
      return this.send(res, 200, o);
    }
    if (req.method === "PATCH" && name !== undefined) {
      if (contentType !== "application/apply-patch+yaml")
        return this.send(res, 415, status(415, `unsupported media type ${contentType}`));
      // "fieldManager is required for apply requests" (400) in the real server.
      if (!query.fieldManager)
        return this.send(
          res,
          400,
          status(
            400,
            'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
          ),
        );
      if (body?.metadata?.name !== name)
        return this.send(res, 400, status(400, "the name of the object does not match the URL"));
      const old = this.store.get(key);
      const next = {
        ...body,
        metadata: {
          ...body.metadata,
          namespace: ns,
          uid: old?.metadata.uid ?? randomUUID(),
          resourceVersion: String(++this.rv),
          managedFields: [{ manager: query.fieldManager, operation: "Apply" }],
        },
        status: old?.status,
      };
      this.store.set(key, next);
      return this.send(res, old ? 200 : 201, next);
    }
    if (req.method === "DELETE" && name !== undefined) {
      if (!this.store.delete(key)) return this.send(res, 404, status(404, `${plural} "${name}" not found`));
      return this.send(res, 200, { ...status(200, ""), status: "Success" });
    }
    return this.send(res, 405, status(405, "method not allowed"));
  }
}

function status(code: number, message: string): Obj {
  return { kind: "Status", apiVersion: "v1", metadata: {}, status: "Failure", message, code };
}
