/** The intake the gateway's extra endpoints share: the body as a JSON object. */
import { isUtf8 } from "node:buffer";
import type { IncomingMessage } from "node:http";
import { BadRequestError, InvalidJsonError } from "../../protocol/errors.ts";
import { parseBodySync } from "../body-parser-pool.ts";
import { readBody } from "../http-util.ts";
import type { ProxyContext } from "../request-context.ts";

/** The body read up to the size limit, UTF-8, parsed (depth-checked), and a JSON object. */
export async function readObjectBody(
  ctx: ProxyContext,
  req: IncomingMessage,
): Promise<{ raw: Buffer; body: Record<string, unknown> }> {
  const raw = await readBody(req, ctx.maxBodyBytes);
  if (!isUtf8(raw)) throw new InvalidJsonError("the body is not valid UTF-8");
  const body = parseBodySync(raw);
  if (typeof body !== "object" || body === null || Array.isArray(body))
    throw new BadRequestError("The request body must be a JSON object.");
  return { raw, body: body as Record<string, unknown> };
}
