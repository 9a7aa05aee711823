/**
 * The failure classification lives with the request plane's contract (src/transport/types.ts);
 * re-exported here for the modules and tests that import it from the router.
 */
export {
  type ConnectionFailureKind,
  connectionFailureKind,
  connectionKindOf,
  type FailureKind,
  failureKind,
  WorkerUnreachableError,
} from "../transport/types.ts";
