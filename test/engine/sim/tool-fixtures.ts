/** A tool and a question the sim's tool-call tests share (answers.test.ts, tool-auto.test.ts). */
import type OpenAI from "openai";

export const WEATHER: OpenAI.ChatCompletionFunctionTool = {
  type: "function",
  function: {
    name: "get_weather",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string" },
        unit: { type: "string", enum: ["c", "f"] },
        days: { type: "integer", minimum: 1, maximum: 7 },
      },
      required: ["city", "unit", "days"],
    },
  },
};
export const MSG = [{ role: "user" as const, content: "What is the weather in Oslo?" }];

/** A tool_choice "auto" request, its answer decided by `seed`. */
export const autoBody = (seed: number): OpenAI.ChatCompletionCreateParamsNonStreaming => ({
  model: "m",
  messages: MSG,
  tools: [WEATHER],
  tool_choice: "auto",
  seed,
  max_tokens: 200,
});
