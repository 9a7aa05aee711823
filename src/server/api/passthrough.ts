import type { IncomingMessage, ServerResponse } from "node:http";
import { BadRequestError, echoInput, InferaError, NotFoundError } from "../../protocol/errors.ts";
import type { LiveWorker, WorkerSet } from "../../router/worker-set.ts";
import {
  ENDPOINT_PATHS,
  type EndpointKind,
  setRawBody,
  WorkerUnreachableError,
} from "../../transport/types.ts";
import { sendError } from "../http-util.ts";
import { relayWhole } from "../relay-whole.ts";
import { countFailure, droppedForClient, type ProxyContext, startRequest } from "../request-context.ts";
import { readObjectBody } from "./intake.ts";
import { servesRoute } from "./translated.ts";

/** Routes whose `model` is optional at the engine (vLLM's Tokenize/DetokenizeRequest). */
const MODEL_OPTIONAL: ReadonlySet<EndpointKind> = new Set(["tokenize", "detokenize"]);
/** Workers tried before the request fails (each unreachable one counts). */
const MAX_TRIES = 3;

let rotation = 0;

/** The model's workers that list the route and are in rotation, fewest in flight first. */
function candidates(workers: WorkerSet, model: string, kind: EndpointKind): LiveWorker[] {
  const g = workers.group(model);
  if (!g)
    throw new NotFoundError(`The model '${echoInput(model)}' does not exist.`, "model_not_found", "model");
  const serving = g.all.filter((w) => servesRoute(w.record, kind));
  if (serving.length === 0)
    throw new NotFoundError(
      `No worker of model '${echoInput(model)}' serves ${ENDPOINT_PATHS[kind]}.`,
      "route_not_served",
      "model",
    );
  const live = serving.filter((w) => w.available);
  const list = live.length > 0 ? live : serving;
  // Rotate first, so that equal loads take turns, then order by load (a stable sort).
  const r = rotation++ % list.length;
  return [...list.slice(r), ...list.slice(0, r)].sort((a, b) => a.inFlight - b.inFlight);
}

function modelOf(workers: WorkerSet, body: Record<string, unknown>, kind: EndpointKind): string {
  if (typeof body.model === "string" && body.model !== "") return body.model;
  const names = workers.modelNames();
  if (MODEL_OPTIONAL.has(kind) && names.length === 1) return names[0]!;
  throw new BadRequestError(
    MODEL_OPTIONAL.has(kind)
      ? "'model' is required when the gateway serves more than one model."
      : "'model' is required.",
    "model",
  );
}

export async function handlePassthrough(
  ctx: ProxyContext,
  workers: WorkerSet,
  kind: EndpointKind,
  req: IncomingMessage,
  res: ServerResponse,
): Promise<void> {
  const { started, requestId, abort } = startRequest(ctx, req, res);
  let model = "";
  try {
    ctx.auth.check(req.headers);
    const { raw, body: b } = await readObjectBody(ctx, req);
    model = modelOf(workers, b, kind);
    // The client's bytes go as they came (an omitted model stays omitted: the engine's default).
    setRawBody(b, raw);
    let last: unknown = null;
    for (const w of candidates(workers, model, kind).slice(0, MAX_TRIES)) {
      try {
        w.inFlight++;
        let up: Awaited<ReturnType<typeof ctx.executor.send>>;
        try {
          up = await ctx.executor.send(w, kind, b, { signal: abort, headers: { "x-request-id": requestId } });
        } finally {
          w.inFlight--;
        }
        if (up.status >= 500) workers.reportFailure(w, "5xx");
        else workers.reportSuccess(w);
        await relayWhole(ctx, res, up, requestId, abort);
        ctx.metrics.countRequest(model, kind, up.status);
        ctx.metrics.observeE2e(model, kind, (performance.now() - started) / 1000);
        return;
      } catch (err) {
        if (!(err instanceof WorkerUnreachableError) || abort.aborted) throw err;
        workers.reportFailure(w, err.kind === "connect" ? "connect" : "reset");
        last = err;
      }
    }
    throw last ?? new InferaError(503, "No worker could take the request.", { code: "no_worker" });
  } catch (err) {
    if (droppedForClient(ctx, err, res, model, abort)) return;
    countFailure(ctx, req, res, model, kind, (err as { status?: number }).status ?? 500);
    sendError(res, err, requestId, ctx.logger);
  } finally {
    ctx.inFlight?.delete(abort);
  }
}
