/**
 * Request handlers: one function per op, validating the JSON meta with zod and answering
 * (meta, data parts). Errors are the typed InferaErrors, sent back as error frames; only
 * framing violations close a connection.
 */
import { z } from "zod";
import { BadRequestError, InferaError } from "../protocol/errors.ts";
import { Op } from "./protocol.ts";
import type { Reservation, TieredStore } from "./store.ts";
import type { L2Entry } from "./tiers/ram-arena.ts";
import { chunkId, type Retention } from "./types.ts";

export interface ConnState {
  /** Set by HELLO: the connection may only touch this namespace. */
  namespace: string | null;
  /** The client maps the arena (received the fd), so GET may answer offsets. */
  arena: boolean;
  leases: Map<number, L2Entry>;
  reservations: Map<number, Reservation>;
  nextHandle: number;
}

export interface Reply {
  meta: Record<string, unknown>;
  data?: Buffer[];
  /** Runs once the reply has been written (releases the leases a copy-path GET held). */
  afterWrite?: () => void;
}

/**
 * NUL is refused in keys and namespaces: a chunk's identity is (namespace, key) joined by a
 * NUL (types.ts chunkId, and the disk tier's file hash), so with NUL allowed namespace "a"
 * could read namespace "a\0b"'s chunk "c" by asking for key "b\0c".
 */
const noNul = (v: string) => !v.includes("\0");
const NUL_MESSAGE = "must not contain NUL (\\u0000)";
const key = z.string().min(1).max(1024).refine(noNul, NUL_MESSAGE);
const ns = z.string().min(1).max(256).refine(noNul, NUL_MESSAGE);
const retention = z.enum(["none", "short", "long"]).optional();
const ttl = z.number().nonnegative().optional();
const item = z.object({ key, size: z.number().int().nonnegative(), retention, ttl_ms: ttl });
const schemas = {
  put: z.object({ ns: ns.optional(), items: z.array(item).min(1).max(4096), retention, ttl_ms: ttl }),
  keys: z.object({
    ns: ns.optional(),
    keys: z.array(key).max(65536),
    copy: z.boolean().optional(),
    ttl_ms: ttl,
  }),
  commit: z.object({ handles: z.array(z.number().int()).max(65536), abort: z.boolean().optional() }),
  release: z.object({ leases: z.array(z.number().int()).max(65536) }),
};

function parse<T>(schema: z.ZodType<T>, meta: unknown): T {
  const r = schema.safeParse(meta);
  if (!r.success) {
    const issue = r.error.issues[0];
    throw new BadRequestError(
      `invalid request: ${issue?.path.join(".")} ${issue?.message}`,
      "meta",
      "invalid_meta",
    );
  }
  return r.data;
}

/** The namespace a request addresses, enforcing the one bound at HELLO. */
export function nsOf(st: ConnState, requested: string | undefined): string {
  const n = requested ?? st.namespace;
  if (!n)
    throw new BadRequestError("no namespace: send HELLO with one or pass ns", "ns", "namespace_required");
  if (st.namespace !== null && n !== st.namespace) {
    throw new InferaError(403, `this connection is bound to namespace "${st.namespace}"`, {
      type: "permission_error",
      param: "ns",
      code: "namespace_forbidden",
    });
  }
  return n;
}

function optsOf(
  it: { retention?: Retention; ttl_ms?: number },
  d: { retention?: Retention; ttl_ms?: number },
) {
  return { retention: it.retention ?? d.retention, ttlMs: it.ttl_ms ?? d.ttl_ms };
}

/**
 * Decode-time hook for a single-item PUT: reserves the arena space up front so the frame's
 * bytes are received straight into it (see DataSink). Anything unusual returns null and
 * takes the ordinary path, which also produces the proper error.
 */
export function putSink(
  store: TieredStore,
  st: ConnState,
  op: number,
  meta: Record<string, unknown>,
  dataLen: number,
  _id?: number,
): { buf: Buffer; token: number } | null {
  if (op !== Op.PUT || dataLen < 64 * 1024) return null;
  let req = singlePut(meta);
  if (!req) {
    // Not the plain shape singlePut checks by hand: let the schema decide.
    const m = schemas.put.safeParse(meta);
    if (!m.success || m.data.items.length !== 1) return null;
    const it = m.data.items[0]!;
    req = { ns: m.data.ns, key: it.key, size: it.size, ...optsOf(it, m.data) };
  }
  if (req.size !== dataLen) return null;
  let n: string;
  try {
    n = nsOf(st, req.ns);
  } catch {
    return null;
  }
  if (store.l2.live(chunkId(n, req.key))) return null;
  const r = store.reserve(n, req.key, dataLen, req);
  if (!r) return null;
  const token = st.nextHandle++;
  st.reservations.set(token, r);
  return { buf: store.l2.arena.buf.subarray(r.ext.offset, r.ext.offset + dataLen), token };
}

interface SinglePut {
  ns?: string;
  key: string;
  size: number;
  retention?: Retention;
  ttlMs?: number;
}

const RETENTIONS: ReadonlySet<unknown> = new Set(["none", "short", "long"]);
const optString = (v: unknown, max: number) =>
  v === undefined || (typeof v === "string" && v.length >= 1 && v.length <= max && noNul(v));
const optRetention = (v: unknown) => v === undefined || RETENTIONS.has(v);
const optTtl = (v: unknown) => v === undefined || (typeof v === "number" && v >= 0 && Number.isFinite(v));

/**
 * The one-item PUT meta, checked by hand: what the schema would accept, for the shape every
 * client sends per chunk, without zod's cost on the path every large PUT takes. Anything it
 * does not recognise returns null and goes to the schema, so it can only accept less.
 */
function singlePut(meta: Record<string, unknown>): SinglePut | null {
  const items = meta.items;
  if (!Array.isArray(items) || items.length !== 1) return null;
  const it = items[0] as Record<string, unknown> | null;
  if (typeof it !== "object" || it === null || Array.isArray(it)) return null;
  const { key, size } = it;
  if (typeof key !== "string" || key.length < 1 || key.length > 1024 || !noNul(key)) return null;
  if (typeof size !== "number" || !Number.isInteger(size) || size < 0) return null;
  if (!optString(meta.ns, 256) || !optRetention(meta.retention) || !optTtl(meta.ttl_ms)) return null;
  if (!optRetention(it.retention) || !optTtl(it.ttl_ms)) return null;
  return {
    ns: meta.ns as string | undefined,
    key,
    size,
    retention: (it.retention ?? meta.retention) as Retention | undefined,
    ttlMs: (it.ttl_ms ?? meta.ttl_ms) as number | undefined,
  };
}

/** A PUT whose bytes were received into the reservation putSink made: commit it. */
export function commitSunkPut(store: TieredStore, st: ConnState, token: number): Reply {
  const r = st.reservations.get(token);
  st.reservations.delete(token);
  return { meta: { stored: [r ? store.commit(r) : false] } };
}

export async function handle(
  store: TieredStore,
  st: ConnState,
  op: number,
  meta: Record<string, unknown>,
  data: Buffer,
  sinkToken?: number,
): Promise<Reply> {
  switch (op) {
    case Op.PUT:
      return sinkToken !== undefined ? commitSunkPut(store, st, sinkToken) : await put(store, st, meta, data);
    case Op.ALLOC:
      return alloc(store, st, meta);
    case Op.COMMIT:
      return commit(store, st, meta);
    case Op.GET:
      return await get(store, st, meta);
    case Op.RELEASE: {
      const m = parse(schemas.release, meta);
      let released = 0;
      for (const l of m.leases) {
        const e = st.leases.get(l);
        if (!e) continue;
        st.leases.delete(l);
        store.l2.release(e);
        released++;
      }
      return { meta: { released } };
    }
    case Op.EXISTS: {
      const m = parse(schemas.keys, meta);
      const n = nsOf(st, m.ns);
      const tiers: (string | null)[] = [];
      for (const k of m.keys) tiers.push(await store.where(n, k));
      return { meta: { exists: tiers.map((t) => t !== null), tiers } };
    }
    case Op.LOOKUP: {
      const m = parse(schemas.keys, meta);
      return { meta: { prefix: await store.lookup(nsOf(st, m.ns), m.keys) } };
    }
    case Op.DELETE: {
      const m = parse(schemas.keys, meta);
      const n = nsOf(st, m.ns);
      const deleted: boolean[] = [];
      for (const k of m.keys) deleted.push(await store.delete(n, k));
      return { meta: { deleted } };
    }
    case Op.PIN: {
      const m = parse(schemas.keys, meta);
      const n = nsOf(st, m.ns);
      return { meta: { pinned: m.keys.map((k) => store.pin(n, k, m.ttl_ms)) } };
    }
    case Op.UNPIN: {
      const m = parse(schemas.keys, meta);
      const n = nsOf(st, m.ns);
      return { meta: { unpinned: m.keys.map((k) => store.unpin(n, k)) } };
    }
    default:
      throw new BadRequestError(`op ${op} is not valid here`);
  }
}

/** Frees what a closing connection still held. */
export function releaseConn(store: TieredStore, st: ConnState): void {
  for (const e of st.leases.values()) store.l2.release(e);
  for (const r of st.reservations.values()) store.abort(r);
  st.leases.clear();
  st.reservations.clear();
}

/** PUT with the data inline in the frame (a PUT into a reservation is commitSunkPut). */
async function put(
  store: TieredStore,
  st: ConnState,
  meta: Record<string, unknown>,
  data: Buffer,
): Promise<Reply> {
  const m = parse(schemas.put, meta);
  const n = nsOf(st, m.ns);
  const total = m.items.reduce((s, i) => s + i.size, 0);
  if (total !== data.length) throw new BadRequestError(`item sizes sum to ${total}, data has ${data.length}`);
  const stored: boolean[] = [];
  let off = 0;
  for (const it of m.items) {
    stored.push(await store.put(n, it.key, data.subarray(off, off + it.size), optsOf(it, m)));
    off += it.size;
  }
  return { meta: { stored } };
}

/** ALLOC: arena reservations the client writes through its mapping, then COMMITs. */
function alloc(store: TieredStore, st: ConnState, meta: Record<string, unknown>): Reply {
  const m = parse(schemas.put, meta);
  const n = nsOf(st, m.ns);
  if (!st.arena) throw new BadRequestError("ALLOC needs the arena (Unix socket, HELLO with arena)");
  const allocs = m.items.map((it) => {
    const r = store.reserve(n, it.key, it.size, optsOf(it, m));
    if (!r) return null;
    const handle = st.nextHandle++;
    st.reservations.set(handle, r);
    return { handle, offset: r.ext.offset, size: it.size };
  });
  return { meta: { allocs } };
}

/** COMMIT (or abort) ALLOC reservations. */
function commit(store: TieredStore, st: ConnState, meta: Record<string, unknown>): Reply {
  const m = parse(schemas.commit, meta);
  const committed = m.handles.map((h) => {
    const r = st.reservations.get(h);
    if (!r) return false;
    st.reservations.delete(h);
    if (m.abort) {
      store.abort(r);
      return false;
    }
    return store.commit(r);
  });
  return { meta: { committed } };
}

/** GET: inline bytes (copied, or read from the arena while held), or arena leases. */
async function get(store: TieredStore, st: ConnState, meta: Record<string, unknown>): Promise<Reply> {
  const m = parse(schemas.keys, meta);
  const n = nsOf(st, m.ns);
  const copy = m.copy === true || !st.arena;
  const items: Record<string, unknown>[] = [];
  const parts: Buffer[] = [];
  const held: L2Entry[] = [];
  for (const k of m.keys) {
    const r = await store.get(n, k);
    if (!r) items.push({ found: false });
    else if ("data" in r) {
      items.push({ found: true, tier: r.tier, size: r.data.length, inline: true });
      parts.push(r.data);
    } else if (copy) {
      // Held until the socket has taken the bytes: they are read from the arena itself.
      store.l2.acquire(r.entry);
      held.push(r.entry);
      items.push({ found: true, tier: r.tier, size: r.entry.size, inline: true });
      parts.push(store.l2.view(r.entry));
    } else {
      store.l2.acquire(r.entry);
      const lease = st.nextHandle++;
      st.leases.set(lease, r.entry);
      items.push({ found: true, tier: r.tier, offset: r.entry.ext.offset, size: r.entry.size, lease });
    }
  }
  return {
    meta: { items },
    data: parts,
    afterWrite: () => {
      for (const e of held) store.l2.release(e);
    },
  };
}
