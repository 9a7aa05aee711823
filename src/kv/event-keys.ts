/**
 * What the index reads from a BlockStored's side fields: the cache salt in vLLM's extra keys,
 * which KV-cache groups make full-prefix hits, and which media are GPU memory.
 */

/** vLLM KVCacheSpecKind values whose blocks make full-prefix hits (vllm/v1/kv_cache_interface.py). */
export const FULL_KINDS = new Set(["full_attention", "mla_attention", "sink_full_attention"]);

export function isGpu(medium: string | null): boolean {
  return medium === null || medium.toUpperCase() === "GPU";
}

/**
 * The cache salt in vLLM's extra keys of a sequence's first block. vLLM builds them as
 * `lora_name? + mm keys (tuples) + [cache_salt] (first block only) + prompt-embeds digests (bytes)`
 * (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys), so the salt is the string
 * after the leading LoRA name. Accepts a per-block list (`[[...first block keys], null, ...]`), a
 * flat list, a bare string or a map with `cache_salt`.
 */
export function saltFromExtraKeys(extraKeys: unknown, loraName: string | null = null): string | null {
  if (extraKeys == null) return null;
  if (typeof extraKeys === "string") return extraKeys === loraName ? null : extraKeys;
  if (Array.isArray(extraKeys)) {
    if (extraKeys.length === 0) return null;
    const perBlock = extraKeys.every((k) => k === null || Array.isArray(k));
    const keys: unknown = perBlock ? extraKeys[0] : extraKeys;
    if (!Array.isArray(keys)) return saltFromExtraKeys(keys, loraName);
    const from = loraName !== null && keys[0] === loraName ? 1 : 0;
    for (let i = keys.length - 1; i >= from; i--) if (typeof keys[i] === "string") return keys[i] as string;
    return null;
  }
  if (typeof extraKeys === "object") {
    const salt = (extraKeys as Record<string, unknown>).cache_salt;
    return typeof salt === "string" ? salt : null;
  }
  return null;
}
