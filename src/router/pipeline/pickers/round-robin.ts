/**
 * round-robin: each request goes to the next candidate in turn, ignoring the totals (an exact,
 * even spread). The turn is per model, shared by its mixed and prefill steps.
 */
import { z } from "zod";
import { definePicker } from "../plugin.ts";

export default definePicker("round-robin", {
  doc: "the next candidate in turn (totals ignored)",
  params: z.object({}).strict(),
  needs: [],
  create: (scope) => {
    const turn = scope.shared("round-robin", () => ({ next: 0 }));
    return {
      name: "round-robin",
      needs: [],
      pick(ctx, at) {
        const k = turn.next % at.length;
        turn.next = (turn.next + 1) % 0x40000000;
        ctx.reason = "round-robin";
        return k;
      },
    };
  },
});
