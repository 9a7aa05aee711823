/**
 * The gateway endpoints beyond chat and completions: translated (/v1/responses, /v1/messages)
 * and pass-through (./passthrough.ts). One table, so the server's route list stays one line.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { EndpointKind } from "../../transport/types.ts";
import { messagesTranslation } from "./messages.ts";
import { handlePassthrough, type PassthroughContext } from "./passthrough.ts";
import { responsesTranslation } from "./responses.ts";
import { handleTranslated } from "./translated.ts";

type Handler = (ctx: PassthroughContext, req: IncomingMessage, res: ServerResponse) => Promise<void>;

const pass =
  (kind: EndpointKind): Handler =>
  (ctx, req, res) =>
    handlePassthrough(ctx, kind, req, res);

const POST: Record<string, Handler> = {
  "/v1/responses": (ctx, req, res) => handleTranslated(ctx, responsesTranslation, req, res),
  "/v1/messages": (ctx, req, res) => handleTranslated(ctx, messagesTranslation, req, res),
  "/v1/embeddings": pass("embeddings"),
  "/v1/rerank": pass("rerank"),
  "/v1/score": pass("score"),
  "/tokenize": pass("tokenize"),
  "/detokenize": pass("detokenize"),
};

export const API_POST_PATHS: readonly string[] = Object.keys(POST);

/** Starts the POST handler of `path`; false when the path is not one of these. */
export function handleApiPost(
  ctx: PassthroughContext,
  path: string,
  req: IncomingMessage,
  res: ServerResponse,
): boolean {
  const h = Object.hasOwn(POST, path) ? POST[path] : undefined;
  if (!h) return false;
  void h(ctx, req, res);
  return true;
}
