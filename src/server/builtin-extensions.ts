/**
 * The extensions `infera server` ships plugged in: the one module that imports the concrete
 * components behind the seams of ./extension-api.ts. Owners of a component add ONE line here.
 */
import { createServerKvIngest } from "../kv/server-ingest.ts";
import { createDisaggRouter } from "../router/disagg/index.ts";
import {
  createNatsExecutor,
  selectKvIngestFactory,
  selectPeerPlaneFactory,
} from "../transport/nats/server-plug.ts";
import type { ServerExtensions } from "./extension-api.ts";
import { createPeerPlane } from "./peer-plane.ts";

/** One line per built-in extension. */
export const builtinExtensions: ServerExtensions = {
  disaggRouterFactory: createDisaggRouter,
  executors: { nats: createNatsExecutor },
  // --event-plane nats → the NATS relays; otherwise each engine's ZMQ events (src/kv/server-ingest.ts).
  kvIngestFactory: selectKvIngestFactory(createServerKvIngest),
  // Replicas share routed prefixes: --event-plane nats → a NATS subject; else a ZMQ mesh (--peers).
  peerPlaneFactory: selectPeerPlaneFactory(createPeerPlane),
};
