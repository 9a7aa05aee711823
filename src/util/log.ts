import { type Logger, pino } from "pino";
import { envVar } from "../config/env-table.ts";
import { maskUrlsDeep, maskUrlUserinfo } from "./mask.ts";

export type { Logger };

/**
 * Structured JSON logs (pino) for every service. Level from INFERA_LOG_LEVEL (default info;
 * tests set "silent" or "warn"). `name` is the component, e.g. "server", "sim", "kvd".
 *
 * Credentials inside URLs (`http://user:pass@host`, a worker record's URL, an etcd endpoint,
 * a NATS URL) are masked in every field, binding and message (src/util/mask.ts), so no caller
 * has to remember to.
 */
export function createLogger(name: string, bindings: Record<string, unknown> = {}): Logger {
  const level = envVar("INFERA_LOG_LEVEL") ?? "info";
  const root = pino({
    name,
    level,
    base: maskUrlsDeep({ pid: process.pid, ...bindings }),
    formatters: {
      log: (o) => maskUrlsDeep(o),
    },
    hooks: {
      logMethod(args, method) {
        // The message (first string argument, after an optional fields object).
        const i = typeof args[0] === "string" ? 0 : typeof args[1] === "string" ? 1 : -1;
        if (i >= 0 && (args[i] as string).includes("@")) args[i] = maskUrlUserinfo(args[i] as string);
        return method.apply(this, args);
      },
    },
  });
  // pino applies no formatter to a child's bindings: mask them on the way in. Children are
  // created with the root as prototype, so they (and theirs) inherit this `child`.
  const child = root.child;
  root.child = function (this: Logger, b, o) {
    return child.call(this, maskUrlsDeep(b), o);
  } as Logger["child"];
  return root;
}
