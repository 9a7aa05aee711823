/** One line per engine the launcher can start. */
import type { EngineKind } from "../../discovery/types.ts";
import { atomAdapter } from "./atom.ts";
import { sglangAdapter } from "./sglang.ts";
import { simAdapter } from "./sim.ts";
import type { EngineAdapter } from "./types.ts";
import { vllmAdapter } from "./vllm.ts";

export const engineAdapters: Record<EngineKind, EngineAdapter> = {
  vllm: vllmAdapter,
  sglang: sglangAdapter,
  atom: atomAdapter,
  sim: simAdapter,
};

export type { EngineAdapter, EngineCommand, LaunchSpec, TransferBackend } from "./types.ts";
