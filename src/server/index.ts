export { type InferaServer, type StartServerOptions, startServer } from "./app.ts";
export {
  defaultServerConfig,
  resolveServerConfig,
  type ServerConfig,
  type ServerConfigInput,
} from "./config.ts";
export {
  builtinExtensions,
  type KvIngest,
  type KvIngestFactory,
  type ServerExtensions,
} from "./extensions.ts";
