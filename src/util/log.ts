import { type Logger, pino } from "pino";
import { envVar } from "../config/env-table.ts";

export type { Logger };

/**
 * Structured JSON logs (pino) for every service. Level from INFERA_LOG_LEVEL (default info;
 * tests set "silent" or "warn"). `name` is the component, e.g. "server", "sim", "kvd".
 */
export function createLogger(name: string, bindings: Record<string, unknown> = {}): Logger {
  const level = envVar("INFERA_LOG_LEVEL") ?? "info";
  return pino({ name, level, base: { pid: process.pid, ...bindings } });
}
