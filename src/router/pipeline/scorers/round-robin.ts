/**
 * round-robin (scorer form): `weight × ((position − turn) mod n)`, so the next worker in turn
 * costs 0 and the spread stays even when other scorers are level; the turn advances when a
 * request is routed. (The `round-robin` picker is the exact, score-free form.)
 */
import { z } from "zod";
import { defineScorer } from "../plugin.ts";

export default defineScorer("round-robin", {
  doc: "distance from the next worker in turn",
  params: z.object({}).strict(),
  needs: [],
  create: (scope) => {
    const turn = scope.shared("round-robin-scorer", () => ({ next: 0 }));
    return {
      name: "round-robin",
      needs: [],
      score(_ctx, at, weight, out) {
        const n = at.length;
        const start = turn.next % n;
        for (let k = 0; k < n; k++) out[k] = weight * ((k - start + n) % n);
      },
      onRouted() {
        turn.next = (turn.next + 1) % 0x40000000;
      },
    };
  },
});
