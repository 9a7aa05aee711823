import { Prng, words } from "../prng.ts";
import type { BenchMessage, BenchRequest } from "../types.ts";

export interface MultiTurnSpec {
  kind: "multi-turn";
  /** Number of distinct system prompts shared by the conversations. Default 4. */
  systemPrompts?: number;
  /** System prompt length in tokens. Default 512. */
  systemLen?: number;
  /** Turns per conversation. Default 4. */
  turns?: number;
  /** User message length range in tokens. Default [32, 128]. */
  userLen?: [number, number];
  /**
   * What the history holds as the assistant's earlier replies:
   * "standin" (default): deterministic filler of the turn's max_tokens length, fixed before the run,
   *   so the requests are identical for the same seed whatever the server answers;
   * "actual": the server's real reply to the previous turn (the stand-in stays when that turn failed).
   */
  replies?: "standin" | "actual";
}

/**
 * Conversations that share a few system prompts. Turn t of a conversation holds the system
 * prompt, every earlier user message and assistant reply, and the new user message; it is sent
 * only once turn t-1 has finished. Conversations are interleaved (turn 0 of every conversation,
 * then turn 1, ...), so the number of conversations is ceil(n / turns).
 */
export function multiTurnWorkload(
  spec: MultiTurnSpec,
  n: number,
  seed: number,
  maxTokens?: number,
): BenchRequest[] {
  const root = new Prng(seed);
  const sysRng = root.fork("multi-turn/system");
  const rng = root.fork("multi-turn/turns");
  const nSys = Math.max(1, spec.systemPrompts ?? 4);
  const sysLen = spec.systemLen ?? 512;
  const turns = Math.max(1, spec.turns ?? 4);
  const [uLo, uHi] = spec.userLen ?? [32, 128];
  const actual = spec.replies === "actual";
  const systems: string[] = [];
  for (let s = 0; s < nSys; s++) systems.push(`You are assistant ${s}. ${words(sysRng, sysLen)}`);

  const nConv = Math.ceil(n / turns);
  interface Conv {
    history: BenchMessage[];
    /** Request index that produced each assistant message of `history`, by message position. */
    replyOf: Map<number, number>;
    last: number | null;
  }
  const convs: Conv[] = [];
  for (let c = 0; c < nConv; c++) {
    convs.push({
      history: [{ role: "system", content: systems[rng.int(0, nSys - 1)] }],
      replyOf: new Map(),
      last: null,
    });
  }
  const out: BenchRequest[] = [];
  for (let t = 0; t < turns && out.length < n; t++) {
    for (let c = 0; c < nConv && out.length < n; c++) {
      const conv = convs[c];
      const index = out.length;
      const max = maxTokens ?? rng.int(32, 128);
      const messages: BenchMessage[] = [
        ...conv.history,
        { role: "user", content: words(rng, rng.int(uLo, uHi)) },
      ];
      const req: BenchRequest = { index, group: `conv-${c}`, messages, maxTokens: max };
      if (conv.last !== null) req.after = conv.last;
      if (actual && conv.replyOf.size > 0) {
        req.replyRefs = [...conv.replyOf].map(([messageIndex, requestIndex]) => ({
          messageIndex,
          requestIndex,
        }));
      }
      out.push(req);
      // Advance the conversation: the stand-in reply for this turn joins the history.
      conv.history = [...messages, { role: "assistant", content: words(rng, max) }];
      conv.replyOf.set(conv.history.length - 1, index);
      conv.last = index;
    }
  }
  return out;
}
