/**
 * A client for vLLM's / SGLang's KV-event replay socket, streamed and resumable.
 *
 * The engine's side (vllm-project/vllm vllm/distributed/kv_events.py at 0181ea3173e5,
 * `ZmqEventPublisher._service_replay`; the same code in sgl-project/sglang
 * python/sglang/srt/disaggregation/kv_events.py at 006d053f182f): a ROUTER takes
 * `[identity, b"", start_seq]` and answers, in one go from the publisher thread, one message
 * `[identity, b"", seq (8-byte BE), payload]` per buffered batch with seq >= start_seq (the buffer
 * is a `deque(maxlen=buffer_steps)` of the last published batches, default 10,000), then
 * `[identity, b"", END_SEQ (-1, 8-byte BE signed), b""]`. A start older than the buffer gets
 * whatever the buffer holds, so its first reply's seq is above the one asked for.
 *
 * A ROUTER drops what it cannot queue to a peer (past the send high-water mark, 1000 by
 * default in libzmq), so a long history can arrive with holes or without its end marker while
 * the reader is still applying the start. Hence:
 * - the receive deadline is a stall timeout (no reply for `stallMs`), never one for the whole
 *   replay: a replay that keeps delivering goes on as long as the history is;
 * - a jump inside a round (a batch dropped in transit) or a stall after some progress ends the
 *   round, and the next asks again from the next missing seq on a fresh DEALER;
 * - only the first reply of a round can tell that the buffer no longer holds what was asked
 *   (nothing is queued before it): that is a hole in the history (`hole`), not a drop;
 * - a round without any reply is tried again a few times (the engine serves replays one at a
 *   time from its publisher thread, so several replicas starting together queue up), then the
 *   replay fails.
 */
import { Dealer } from "zeromq";
import "../util/zmq-limits.ts";
import { encodeSeq, readSeq } from "./events.ts";

export type ReplayOutcome = "ok" | "hole" | "failed" | "closed";

export interface ReplayHooks {
  endpoint: string;
  /** How long a round may go without a reply before it ends. */
  stallMs: number;
  /** The last seq applied (-1: none); the next round asks from the one after it. */
  lastSeq(): number;
  /**
   * One batch, in seq order. `hole`: the buffer no longer held the batches before this one
   * (the caller forgets what they would have changed).
   */
  deliver(seq: number, payload: Uint8Array | null, hole: boolean): void;
  closed(): boolean;
  malformed(error: string): void;
}

export interface ReplayResult {
  outcome: ReplayOutcome;
  rounds: number;
  batches: number;
  error?: string;
}

/** Messages the DEALER queues ahead of the reader: above vLLM's default buffer_steps, so one round usually takes a whole buffer. */
export const REPLAY_RCVHWM = 16_384;
/** Rounds without any reply before the replay fails. */
const IDLE_ROUNDS = 3;
/** A bound on rounds, each of which must make progress (a history is finite). */
const MAX_ROUNDS = 10_000;
const YIELD_AFTER_MS = 20;

/** Streams the engine's buffer from `start` (or the last applied seq + 1) to its end marker. */
export async function streamReplay(start: number, h: ReplayHooks): Promise<ReplayResult> {
  let hole = false;
  let rounds = 0;
  let idle = 0;
  let batches = 0;
  let workStart = performance.now();
  while (rounds < MAX_ROUNDS) {
    const from = Math.max(start, h.lastSeq() + 1);
    rounds++;
    const dealer = new Dealer({ linger: 0, receiveTimeout: h.stallMs, receiveHighWaterMark: REPLAY_RCVHWM });
    let progressed = false;
    try {
      dealer.connect(h.endpoint);
      await dealer.send([Buffer.alloc(0), encodeSeq(from)]);
      for (;;) {
        if (h.closed()) return { outcome: "closed", rounds, batches };
        let frames: Buffer[];
        try {
          frames = await dealer.receive();
        } catch (err) {
          if (h.closed()) return { outcome: "closed", rounds, batches };
          if (progressed) break; // the tail or the end marker was dropped: ask again
          if (++idle >= IDLE_ROUNDS)
            return { outcome: "failed", rounds, batches, error: (err as Error).message };
          break;
        }
        // ROUTER replies [b"", seq, payload]; tolerate a reply without the empty delimiter.
        const parts = frames.length >= 3 && frames[0].length === 0 ? frames.slice(1) : frames;
        const seq = parts.length >= 1 ? readSeq(parts[0]) : null;
        if (seq === null) {
          h.malformed("replay reply without an 8-byte seq");
          continue;
        }
        if (seq === -1) return { outcome: hole ? "hole" : "ok", rounds, batches };
        const expected = h.lastSeq() + 1;
        if (seq < expected) continue;
        const payload = parts.length >= 2 ? parts[1] : null;
        if (seq > expected) {
          // Dropped in transit: end the round and ask from `expected` again.
          if (progressed) break;
          hole = true;
          h.deliver(seq, payload, true);
        } else h.deliver(seq, payload, false);
        progressed = true;
        idle = 0;
        batches++;
        if (performance.now() - workStart > YIELD_AFTER_MS) {
          await new Promise<void>((r) => setImmediate(r));
          workStart = performance.now();
        }
      }
    } catch (err) {
      if (h.closed()) return { outcome: "closed", rounds, batches };
      return { outcome: "failed", rounds, batches, error: (err as Error).message };
    } finally {
      dealer.close();
    }
  }
  return { outcome: "failed", rounds, batches, error: "too many replay rounds" };
}
