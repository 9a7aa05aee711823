/**
 * A test publisher's view of its subscribers. A ZMQ PUB drops what it sends before a
 * subscriber's subscription has reached it (ZMQ's slow joiner), and a fixed sleep for that is too
 * short on a loaded box. An XPUB is the same wire for a SUB (libzmq's SUB accepts PUB or XPUB
 * peers) and passes each subscription up: with verbosity allSubs every one, not only a topic's
 * first. libzmq applies a subscription to the XPUB's trie before it queues it for `recv`
 * (zeromq/libzmq src/xpub.cpp `xread_activated` @ 0319cb2cd16aa40911855a1765312886bf081db2),
 * so what is published after `subscribed()` resolves reaches that SUB.
 */
import { XPublisher } from "zeromq";
import { waitUntil } from "./wait.ts";

export interface SubscriptionWatch {
  /** Subscribe messages received (one per SUB connection and topic; again on a reconnect). */
  count(): number;
  /** Resolves once `n` subscriptions in all have reached the publisher. */
  subscribed(n?: number, ms?: number): Promise<void>;
}

/**
 * vLLM's KV-event PUB send high-water mark: `ZmqEventPublisher.__init__` `hwm: int = 100_000`,
 * then `self._pub.set_hwm(self._hwm)` (vllm-project/vllm vllm/distributed/kv_events.py @
 * 0181ea3173e53eea8cf04a86891488e3dc89bb34, unchanged @ b4e69e0af33f4698e157a262cc787fe61983cd3d).
 * With libzmq's default of 1000, a burst that libzmq's I/O thread had not yet moved on a loaded
 * box overflowed the PUB's queue and was dropped: a gap the real engine would not have made.
 */
export const VLLM_PUB_HWM = 100_000;

/**
 * An XPUB that counts the subscriptions reaching it; read until the socket closes. `sendHwm` is
 * the PUB's send high-water mark (libzmq's default 1000 unless given).
 */
export function watchedPublisher(sendHwm?: number): { pub: XPublisher; watch: SubscriptionWatch } {
  const pub = new XPublisher({
    linger: 0,
    verbosity: "allSubs",
    ...(sendHwm === undefined ? {} : { sendHighWaterMark: sendHwm }),
  });
  let subscriptions = 0;
  void (async () => {
    try {
      // [1, topic…] subscribes, [0, topic…] unsubscribes (libzmq's XPUB message).
      for await (const [msg] of pub) if (msg?.[0] === 1) subscriptions++;
    } catch {
      // closed
    }
  })();
  return {
    pub,
    watch: {
      count: () => subscriptions,
      subscribed: (n = 1, ms = 10_000) =>
        waitUntil(() => subscriptions >= n, ms, `${n} subscription(s) at ${pub.lastEndpoint ?? "the PUB"}`),
    },
  };
}
