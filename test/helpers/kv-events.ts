/**
 * Builders for KV events in tests and benches, so that each caller names only what its case is
 * about (hashes, tokens, block size; a LoRA, a medium, a group) and not the fields it leaves at
 * their usual value.
 *
 * - `blockStored` / `blockRemoved`: the decoded objects of src/kv/event-model.ts, as
 *   `KvIndex.apply`/`applyEvents` take them. Defaults: a root block (no parent), GPU memory, no
 *   LoRA, no extra keys, no KV-cache group.
 * - `storedWire` / `removedWire`: what a vLLM publisher puts on the wire for the same events, for
 *   tests that publish msgpack batches. Field order from vllm-project/vllm
 *   vllm/distributed/kv_events.py @ 0181ea3173e53eea8cf04a86891488e3dc89bb34 (`BlockStored`:
 *   block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
 *   extra_keys, group_idx; `BlockRemoved`: block_hashes, medium, group_idx).
 *
 * Tests that pin an engine's exact layout (golden frames, the batch decoder's cases) write their
 * arrays out in full, with their citation, rather than through these.
 */
import type { BlockRemoved, BlockStored, EngineBlockHash } from "../../src/kv/events.ts";

/** A decoded `BlockStored`: `more` overrides any default (parent, medium, LoRA, group, …). */
export function blockStored(
  blockHashes: EngineBlockHash[],
  tokenIds: number[],
  blockSize: number,
  more: Partial<Omit<BlockStored, "type">> = {},
): BlockStored {
  return {
    type: "BlockStored",
    blockHashes,
    parentBlockHash: null,
    tokenIds,
    blockSize,
    loraId: null,
    medium: "GPU",
    loraName: null,
    extraKeys: null,
    groupIdx: null,
    ...more,
  };
}

/**
 * The first `blocks` full blocks of `tokens` (all of them by default) as one root `BlockStored`,
 * with engine hashes `hashBase`, `hashBase + 1`, …: an engine that has just prefilled a prompt.
 */
export function storedPrefix(
  tokens: readonly number[],
  blockSize: number,
  hashBase: number,
  more: Partial<Omit<BlockStored, "type">> = {},
  blocks = Math.floor(tokens.length / blockSize),
): BlockStored {
  const hashes = Array.from({ length: blocks }, (_, i) => hashBase + i);
  return blockStored(hashes, tokens.slice(0, blocks * blockSize), blockSize, more);
}

/** A decoded `BlockRemoved`; GPU memory and no group unless `more` says otherwise. */
export function blockRemoved(
  blockHashes: EngineBlockHash[],
  more: Partial<Omit<BlockRemoved, "type">> = {},
): BlockRemoved {
  return { type: "BlockRemoved", blockHashes, medium: "GPU", groupIdx: null, ...more };
}

/** vLLM's positional `BlockStored` on GPU memory, group 0, no LoRA or extra keys. */
export function storedWire(hashes: number[], parent: number | null, tokens: number[], bs: number): unknown[] {
  return ["BlockStored", hashes, parent, tokens, bs, null, "GPU", null, null, 0];
}

/** vLLM's tagged-map `BlockRemoved` (the newer encoding) on GPU memory, group 0. */
export function removedWire(hashes: number[]): unknown {
  return { type: "BlockRemoved", block_hashes: hashes, medium: "GPU", group_idx: 0 };
}
