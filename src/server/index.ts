export { type InferaServer, type StartServerOptions, startServer } from "./app.ts";
export { builtinExtensions } from "./builtin-extensions.ts";
export {
  defaultServerConfig,
  resolveServerConfig,
  type ServerConfig,
  type ServerConfigInput,
} from "./config.ts";
export type {
  ExecutorFactory,
  KvIngest,
  KvIngestFactory,
  ManagedExecutor,
  ServerComponentContext,
  ServerExtensions,
} from "./extension-api.ts";
