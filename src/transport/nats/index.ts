/** The NATS transport: request plane (client + agent), KV-event plane (relay + subscriber), connection. */
export { NatsRequestAgent, type RequestAgentOptions, startRequestAgent } from "./agent.ts";
export {
  addNatsOptions,
  type EventPlane,
  type NatsCliValues,
  type RequestPlane,
  resolveTransport,
  type TransportSettings,
} from "./cli-options.ts";
export { type NatsExecutorOptions, NatsRequestExecutor } from "./client.ts";
export {
  buildConnectionOptions,
  connectNats,
  type NatsConnectOptions,
  type NatsTlsOptions,
} from "./connection.ts";
export { type KvRelayOptions, NatsKvRelay, startKvRelay } from "./kv-relay.ts";
export { NatsKvSubscriber, type NatsKvSubscriberOptions, startKvSubscriber } from "./kv-subscriber.ts";
export { controlSubject, kvReplaySubject, kvSubject, requestSubject, subjectToken } from "./subjects.ts";
