/**
 * Per-flow usage limits (issue #29 item 3): requests per minute and tokens per minute, each a
 * token bucket that holds one minute's allowance and refills continuously (SGLang's model
 * gateway and GIE's usage limits work the same way). A request takes 1 from the RPM bucket and
 * its prompt + expected output tokens from the TPM bucket, or is answered 429 with the seconds
 * until both hold enough (Retry-After).
 *
 * N replicas: each replica enforces `limit / replicas` (config `flow.replicas`) on its own
 * counters. A shared counter (NATS/etcd) would add a hop to every request's admission and a
 * dependency that can stall it; behind a load balancer that spreads a key's requests evenly the
 * split is exact on average, and it errs on the strict side when a key sticks to one replica.
 */
import { InferaError } from "../../protocol/errors.ts";

export type RejectReason = "queue_full" | "queue_timeout" | "rate_limit_rpm" | "rate_limit_tpm";

/** 429 in OpenAI's shape (`rate_limit_error`) with Retry-After in whole seconds. */
export class FlowRejectedError extends InferaError {
  readonly reason: RejectReason;
  constructor(reason: RejectReason, message: string, retryAfterS: number) {
    super(429, message, {
      type: "rate_limit_error",
      code: reason,
      headers: { "retry-after": String(Math.max(1, Math.ceil(retryAfterS))) },
    });
    this.reason = reason;
  }
}

export interface FlowLimits {
  /** Requests per minute (0: none). */
  readonly rpm: number;
  /** Prompt + expected output tokens per minute (0: none). */
  readonly tpm: number;
}

interface Bucket {
  level: number;
  at: number;
}

const MINUTE_MS = 60_000;
/** Buckets kept at most; a full bucket is the same as none, so those go first. */
const MAX_BUCKETS = 10_000;

export class RateLimiter {
  private readonly buckets = new Map<string, Bucket>();
  private readonly divisor: number;

  /** `replicas`: the limits are split evenly among this many replicas. */
  constructor(replicas = 1) {
    this.divisor = Math.max(1, replicas);
  }

  /**
   * Takes one request of `tokens` tokens from `flow`'s buckets, or throws FlowRejectedError
   * (nothing taken) naming the limit that refused it.
   */
  take(flow: string, limits: FlowLimits, tokens: number, now = performance.now()): void {
    const rpm = limits.rpm / this.divisor;
    const tpm = limits.tpm / this.divisor;
    const r = rpm > 0 ? this.bucket(`r\0${flow}`, rpm, now) : null;
    const t = tpm > 0 ? this.bucket(`t\0${flow}`, tpm, now) : null;
    if (r && r.level < 1)
      throw new FlowRejectedError(
        "rate_limit_rpm",
        `Rate limit reached: ${limits.rpm} requests per minute for this key.`,
        ((1 - r.level) / rpm) * 60,
      );
    // A request larger than a whole minute's allowance waits for a full bucket, not forever.
    const need = t ? Math.min(tokens, tpm) : 0;
    if (t && t.level < need)
      throw new FlowRejectedError(
        "rate_limit_tpm",
        `Rate limit reached: ${limits.tpm} tokens per minute for this key.`,
        ((need - t.level) / tpm) * 60,
      );
    if (r) r.level -= 1;
    if (t) t.level -= need;
  }

  private bucket(key: string, perMinute: number, now: number): Bucket {
    let b = this.buckets.get(key);
    if (!b) {
      if (this.buckets.size >= MAX_BUCKETS) this.prune(now);
      b = { level: perMinute, at: now };
      this.buckets.set(key, b);
      return b;
    }
    b.level = Math.min(perMinute, b.level + ((now - b.at) / MINUTE_MS) * perMinute);
    b.at = now;
    return b;
  }

  /** Drops buckets idle for a minute (they would be full again). */
  private prune(now: number): void {
    for (const [k, b] of this.buckets) if (now - b.at >= MINUTE_MS) this.buckets.delete(k);
  }
}
