/** KV cache events as the block pool emits them (encoded for the wire by kv-publisher.ts). */
/**
 * A block hash on the wire: the sim's 64-bit hash (an int, as GPU events carry it), or raw
 * digest bytes, as vLLM's offloading connector reports its blocks (./block-pool.ts).
 */
export type SimBlockHash = bigint | Uint8Array;

export interface BlockStoredEvent {
  type: "BlockStored";
  blockHashes: SimBlockHash[];
  parentBlockHash: bigint | null;
  tokenIds: number[];
  blockSize: number;
  /** One entry per block: `[cache_salt]` for a salted request's first block, else null. */
  extraKeys: (string[] | null)[] | null;
  /** The request's cache_salt (SGLang carries it on every page of a salted request). */
  salt?: string | null;
  /** The medium (absent: "GPU"); "CPU" for vLLM's offloading connector's reports. */
  medium?: string;
}

export interface BlockRemovedEvent {
  type: "BlockRemoved";
  blockHashes: SimBlockHash[];
  medium?: string;
}

export interface AllBlocksClearedEvent {
  type: "AllBlocksCleared";
}

export type KvEvent = BlockStoredEvent | BlockRemovedEvent | AllBlocksClearedEvent;
