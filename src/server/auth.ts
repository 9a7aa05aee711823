/**
 * API-key check. Keys are compared as SHA-256 digests with `timingSafeEqual`, so neither the
 * content nor the length of a configured key leaks through response timing. Keys are never
 * logged (the server logger redacts the authorization header).
 */
import { createHash, createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import type { IncomingHttpHeaders } from "node:http";
import { AuthenticationError } from "../protocol/errors.ts";

const digest = (s: string): Buffer => createHash("sha256").update(s).digest();

/** The API key a request carries: `Authorization: Bearer <key>`, else `x-api-key`. */
export function apiKeyOf(headers: IncomingHttpHeaders): string | undefined {
  const auth = headers.authorization;
  if (typeof auth === "string" && auth.length > 7 && auth.slice(0, 7).toLowerCase() === "bearer ")
    return auth.slice(7).trim();
  const x = headers["x-api-key"];
  return typeof x === "string" ? x : undefined;
}

export class ApiKeyAuth {
  private readonly digests: Buffer[];
  /** Signs dashboard sessions; per process, so a restart ends them. */
  private readonly sessionSecret = randomBytes(32);

  constructor(keys: readonly string[]) {
    this.digests = keys.filter((k) => k.length > 0).map(digest);
  }

  get enabled(): boolean {
    return this.digests.length > 0;
  }

  /**
   * A dashboard session value for a key that passed `check`: an HMAC of its digest under a
   * per-process secret, so the cookie holding it is not the key itself.
   */
  sessionFor(key: string): string {
    return this.sign(digest(key));
  }

  /** Whether `value` is a session value of a configured key (compared in constant time). */
  checkSession(value: string): boolean {
    const given = Buffer.from(value);
    let ok = false;
    for (const d of this.digests) {
      const want = Buffer.from(this.sign(d));
      ok = (want.length === given.length && timingSafeEqual(want, given)) || ok;
    }
    return ok;
  }

  private sign(d: Buffer): string {
    return createHmac("sha256", this.sessionSecret).update(d).digest("base64url");
  }

  /** Throws AuthenticationError unless the request carries a configured key. */
  check(headers: IncomingHttpHeaders): void {
    if (this.digests.length === 0) return;
    const key = apiKeyOf(headers);
    if (!key) throw new AuthenticationError("Missing API key: send `Authorization: Bearer <key>`.");
    const d = digest(key);
    let ok = false;
    // Compare against every key (no early exit), so the position of a match is not observable.
    for (const k of this.digests) ok = timingSafeEqual(d, k) || ok;
    if (!ok) throw new AuthenticationError();
  }
}
