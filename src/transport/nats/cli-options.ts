/**
 * The NATS flags shared by `infera server` and `infera engine`, so both ends take the same
 * settings. Default planes: `nats` for both when a NATS URL is given (NATS is the production
 * broker), `http` + `zmq` otherwise (the no-broker path).
 */
import { type Command, InvalidArgumentError, Option } from "commander";
import type { NatsConnectOptions } from "./connection.ts";

export type RequestPlane = "http" | "nats";
export type EventPlane = "zmq" | "nats";

export interface NatsCliValues {
  requestPlane?: string;
  eventPlane?: string;
  natsUrl?: string;
  natsToken?: string;
  natsUser?: string;
  natsPassword?: string;
  natsNkeySeedFile?: string;
  natsTlsCa?: string;
  natsTlsCert?: string;
  natsTlsKey?: string;
  /** `--nats-allow-anonymous`: no warning when NATS takes clients without auth. */
  natsAllowAnonymous?: boolean;
  /** `--nats-reconnect-wait-ms` (server only), as given. */
  natsReconnectWaitMs?: string;
}

export interface TransportSettings {
  requestPlane: RequestPlane;
  eventPlane: EventPlane;
  /** Present when either plane is NATS. */
  nats?: NatsConnectOptions;
}

/**
 * Adds the flags to a subcommand. Secrets may come from the environment instead of argv.
 * `requestPlaneFlag: false` leaves out `--request-plane` for a command that already has one.
 */
export function addNatsOptions(
  cmd: Command,
  opts: { requestPlaneFlag?: boolean; serverFlags?: boolean } = {},
): Command {
  if (opts.serverFlags) {
    cmd.addOption(
      new Option(
        "--nats-reconnect-wait-ms <ms>",
        "how long a request not yet streaming waits for a lost NATS connection to come back (default 10000; 0 = fail at once)",
      )
        .argParser((v) => String(parseWaitMs(v, "--nats-reconnect-wait-ms", InvalidArgumentError)))
        .env("INFERA_NATS_RECONNECT_WAIT_MS"),
    );
  }
  if (opts.requestPlaneFlag !== false) {
    cmd.addOption(
      new Option(
        "--request-plane <plane>",
        "how the server reaches workers (default: nats with --nats-url, else http)",
      )
        .choices(["http", "nats"])
        .env("INFERA_REQUEST_PLANE"),
    );
  }
  return cmd
    .addOption(
      new Option(
        "--event-plane <plane>",
        "how KV events reach servers (default: nats with --nats-url, else zmq)",
      )
        .choices(["zmq", "nats"])
        .env("INFERA_EVENT_PLANE"),
    )
    .addOption(
      new Option(
        "--nats-url <urls>",
        "NATS server URL(s), comma-separated; credentials in one only via INFERA_NATS_URL",
      ).env("INFERA_NATS_URL"),
    )
    .addOption(
      new Option("--nats-token <token>", "refused (argv is public): NATS token in INFERA_NATS_TOKEN").env(
        "INFERA_NATS_TOKEN",
      ),
    )
    .addOption(new Option("--nats-user <user>", "NATS user").env("INFERA_NATS_USER"))
    .addOption(
      new Option("--nats-password <password>", "refused (argv is public): in INFERA_NATS_PASSWORD").env(
        "INFERA_NATS_PASSWORD",
      ),
    )
    .addOption(
      new Option("--nats-nkey-seed-file <path>", "file holding a NATS nkey user seed (SU...)").env(
        "INFERA_NATS_NKEY_SEED_FILE",
      ),
    )
    .addOption(
      new Option(
        "--nats-allow-anonymous",
        "connecting to a NATS that takes clients without auth is intended (silences the warning)",
      ).env("INFERA_NATS_ALLOW_ANONYMOUS"),
    )
    .addOption(new Option("--nats-tls-ca <path>", "CA bundle (PEM) for the NATS server's certificate"))
    .addOption(new Option("--nats-tls-cert <path>", "client certificate (PEM) for NATS mutual TLS"))
    .addOption(new Option("--nats-tls-key <path>", "client key (PEM) for NATS mutual TLS"));
}

/** A non-negative integer number of milliseconds, or the given error. */
function parseWaitMs(v: string, what: string, E: new (m: string) => Error = Error): number {
  const n = Number(v);
  if (v.trim() === "" || !Number.isInteger(n) || n < 0)
    throw new E(`${what} must be a whole number of ms >= 0, got "${v}"`);
  return n;
}

/** Just the connect options from flag values (undefined without a URL). */
export function natsConnectFromCli(v: NatsCliValues, name?: string): NatsConnectOptions | undefined {
  if (v.natsUrl === undefined || v.natsUrl === "") return undefined;
  const tls =
    v.natsTlsCa || v.natsTlsCert || v.natsTlsKey
      ? { caFile: v.natsTlsCa, certFile: v.natsTlsCert, keyFile: v.natsTlsKey }
      : undefined;
  return {
    url: v.natsUrl,
    token: v.natsToken,
    user: v.natsUser,
    password: v.natsPassword,
    nkeySeedFile: v.natsNkeySeedFile,
    tls,
    name,
    allowAnonymous: v.natsAllowAnonymous,
    reconnectWaitMs:
      v.natsReconnectWaitMs === undefined || v.natsReconnectWaitMs === ""
        ? undefined
        : parseWaitMs(v.natsReconnectWaitMs, "--nats-reconnect-wait-ms"),
  };
}

/** Turns parsed flag values into plane choices and connect options; throws on contradictions. */
export function resolveTransport(v: NatsCliValues, name?: string): TransportSettings {
  const hasUrl = v.natsUrl !== undefined && v.natsUrl !== "";
  const requestPlane = (v.requestPlane ?? (hasUrl ? "nats" : "http")) as RequestPlane;
  const eventPlane = (v.eventPlane ?? (hasUrl ? "nats" : "zmq")) as EventPlane;
  if (requestPlane !== "http" && requestPlane !== "nats")
    throw new Error(`bad --request-plane ${requestPlane}`);
  if (eventPlane !== "zmq" && eventPlane !== "nats") throw new Error(`bad --event-plane ${eventPlane}`);
  if ((requestPlane === "nats" || eventPlane === "nats") && !hasUrl) {
    throw new Error("--request-plane nats / --event-plane nats need --nats-url (or INFERA_NATS_URL)");
  }
  if (!hasUrl) return { requestPlane, eventPlane };
  return { requestPlane, eventPlane, nats: natsConnectFromCli(v, name) };
}
