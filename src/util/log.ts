import { type Logger, pino } from "pino";

export type { Logger };

/**
 * Structured JSON logs (pino) for every service. Level from INFERA_LOG_LEVEL (default info;
 * tests set "silent" or "warn"). `name` is the component, e.g. "server", "sim", "kvd".
 */
export function createLogger(name: string, bindings: Record<string, unknown> = {}): Logger {
  const level = process.env.INFERA_LOG_LEVEL ?? "info";
  return pino({ name, level, base: { pid: process.pid, ...bindings } });
}
