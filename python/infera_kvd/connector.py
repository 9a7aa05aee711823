"""InferaKvdConnector: a vLLM v1 KV connector (KVConnectorBase_V1) backed by `infera kvd`.

Enable with::

    --kv-transfer-config '{"kv_connector":"InferaKvdConnector",
      "kv_connector_module_path":"infera_kvd.connector", "kv_role":"kv_both",
      "kv_connector_extra_config":{"infera_kvd_socket":"/run/infera/kvd.sock"}}'

Layout in kvd: namespace ``<model>@tp<size>``; a prompt is cut into chunks of
``chunk_tokens`` (a multiple of the block size, default 256 tokens); chunk *i*'s key is a
sha256 chained over the token ids of chunks 0..i, so equal prefixes share keys. Each layer
of a chunk is stored under ``<chunk>/r<rank>/<layer>``; after all layers of a chunk are
saved the worker writes a 1-byte marker ``<chunk>/r<rank>``. The scheduler's LOOKUP runs
on the markers, so it never promises tokens whose layers were not all written; it then checks
every layer key of those chunks in one EXISTS batch (the layer names come from a
``layout/r<rank>`` record each worker writes in register_kv_caches) and soft-pins them for
30 s, so a layer evicted after its marker is not promised, and what is promised stays in RAM
until the worker loads it (a pin holds L2 only: a chunk that lives only on L3 can still be
dropped by disk pressure in that window, and the worker then logs the miss).

Retention comes from the request: ``kv_transfer_params["infera_retention"]`` is ``none``
(nothing of the request is stored; a cached prefix may still be loaded), ``short`` or
``long`` (default); kvd evicts ``short`` before ``long``. Loads read straight from the shared arena (zero-copy into a CPU tensor view,
then one copy to the device). The vLLM base class is imported when available; without
vLLM the module still imports (the base falls back to a class with the same constructor
contract and read-only ``role``) so it can be import-checked and unit-tested.

vLLM constructs the connector as ``cls(vllm_config, role, kv_cache_config)``. The connector
does not implement ``SupportsHMA``: vLLM refuses it while the hybrid KV cache manager is on,
so run with ``--disable-hybrid-kv-cache-manager`` where vLLM does not turn it off itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from .client import KvdClient, PutItem

logger = logging.getLogger("infera_kvd.connector")

try:  # pragma: no cover - exercised only where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )

    HAVE_VLLM = True
except Exception:  # vLLM absent (or a version without the v1 API)
    HAVE_VLLM = False

    class KVConnectorMetadata:  # type: ignore[no-redef]
        pass

    class KVConnectorRole:  # type: ignore[no-redef]
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorBase_V1:  # type: ignore[no-redef]
        """Fallback with vLLM's constructor contract (vllm_config, role, kv_cache_config), so
        the connector's code path is the same with and without vLLM: ``role`` is read-only."""

        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
            self._connector_metadata: Optional[KVConnectorMetadata] = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = getattr(vllm_config, "kv_transfer_config", None)
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self) -> Any:
            return self._role

        def bind_connector_metadata(self, connector_metadata: Any) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self) -> Any:
            assert self._connector_metadata is not None, "no connector metadata bound"
            return self._connector_metadata


RETENTIONS = ("none", "short", "long")
DEFAULT_CHUNK_TOKENS = 256
# Soft pin on the chunks a scheduler decision promised, until the worker has loaded them.
PIN_TTL_MS = 30_000


def retention_of(request: Any) -> str:
    params = getattr(request, "kv_transfer_params", None) or {}
    r = params.get("infera_retention", "long") if isinstance(params, dict) else "long"
    return r if r in RETENTIONS else "long"


def chunk_keys(token_ids: Sequence[int], chunk_tokens: int) -> List[str]:
    """Chained sha256 per full chunk: key i covers tokens [0, (i+1)*chunk_tokens)."""
    keys: List[str] = []
    prev = b""
    for start in range(0, len(token_ids) - chunk_tokens + 1, chunk_tokens):
        part = struct.pack(f"<{chunk_tokens}q", *token_ids[start : start + chunk_tokens])
        prev = hashlib.sha256(prev + part).digest()
        keys.append(prev.hex())
    return keys


@dataclass
class ReqMeta:
    req_id: str
    token_ids: List[int]
    block_ids: List[int]
    load_chunks: int = 0  # chunks to load from kvd (0 = none)
    store: bool = False
    retention: str = "long"
    # Full chunks whose KV exists once this step ran (computed or loaded); chunks in
    # [load_chunks, store_until) are saved. A prompt prefilled over several steps (chunked
    # prefill) only has the chunks of its first step saved in this version.
    store_until: int = 0


@dataclass
class InferaKvdConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    requests: List[ReqMeta] = field(default_factory=list)


def _block_ids(blocks: Any) -> List[int]:
    """vLLM passes block ids as a list, or as a tuple of lists (one per KV cache group)."""
    if blocks is None:
        return []
    if isinstance(blocks, (tuple, list)) and blocks and isinstance(blocks[0], (tuple, list)):
        return list(blocks[0])
    return list(blocks)


class InferaKvdConnector(KVConnectorBase_V1):  # type: ignore[misc,valid-type]
    def __init__(
        self,
        vllm_config: Any,
        role: Any,
        kv_cache_config: Any = None,
        *,
        client: Optional[KvdClient] = None,
    ) -> None:
        # vLLM's factory builds external connectors as cls(vllm_config, role, kv_cache_config)
        # and refuses a class whose __init__ has no kv_cache_config; `role` is a read-only
        # property of KVConnectorBase_V1, set only through its constructor.
        super().__init__(vllm_config, role, kv_cache_config)
        extra: Dict[str, Any] = {}
        ktc = getattr(vllm_config, "kv_transfer_config", None)
        if ktc is not None:
            extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        cache = getattr(vllm_config, "cache_config", None)
        self.block_size = int(getattr(cache, "block_size", 16) or 16)
        ct = int(extra.get("infera_kvd_chunk_tokens", DEFAULT_CHUNK_TOKENS))
        self.chunk_tokens = max(self.block_size, (ct // self.block_size) * self.block_size)
        par = getattr(vllm_config, "parallel_config", None)
        self.tp_size = int(getattr(par, "tensor_parallel_size", 1) or 1)
        self.rank = int(extra.get("infera_kvd_rank", os.environ.get("RANK", 0)))
        model = str(getattr(getattr(vllm_config, "model_config", None), "model", "model"))
        self.namespace = str(extra.get("infera_kvd_namespace", f"{model}@tp{self.tp_size}"))
        socket_path = extra.get("infera_kvd_socket") or os.environ.get("INFERA_KVD_SOCKET", "/run/infera/kvd.sock")
        self.client = client or KvdClient(socket_path=socket_path, namespace=self.namespace)
        # scheduler-side state
        self._retention: Dict[str, str] = {}
        self._layouts: Optional[List[List[str]]] = None
        self._need_load: Dict[str, int] = {}
        # worker-side state
        self._kv_caches: Dict[str, Any] = {}
        self._saved: List[Tuple[str, str]] = []  # (marker key, retention) to write in wait_for_save

    # -- scheduler side ------------------------------------------------------------------
    def _marker_keys(self, keys: Sequence[str]) -> List[List[str]]:
        return [[f"{k}/r{r}" for k in keys] for r in range(self.tp_size)]

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        retention = retention_of(request)
        self._retention[request.request_id] = retention
        tokens = list(request.prompt_token_ids)
        # Leave at least one prompt token to compute, so the engine produces logits.
        keys = chunk_keys(tokens[: max(0, len(tokens) - 1)], self.chunk_tokens)
        if not keys:
            return 0, False
        # Every rank must hold the chunk for it to count.
        stored = min(self.client.lookup(mk) for mk in self._marker_keys(keys))
        stored = self._verify_and_pin(keys[:stored])
        matched = stored * self.chunk_tokens - num_computed_tokens
        return (matched if matched > 0 else 0), False

    def _layer_names(self) -> Optional[List[List[str]]]:
        """Each rank's layer names, from the layout record its worker wrote at start-up."""
        if self._layouts is None:
            found = self.client.get_copy([f"layout/r{r}" for r in range(self.tp_size)])
            if all(found):
                self._layouts = [json.loads(b) for b in found if b is not None]
        return self._layouts

    def _verify_and_pin(self, keys: List[str]) -> int:
        """
        Markers only say that all layers were written. A layer chunk may have been evicted
        since (it is older than its marker in LRU order), so check every layer key in one
        EXISTS batch and soft-pin what will be loaded for PIN_TTL_MS, so that it is still in
        RAM when the worker's GET comes. Returns the number of leading chunks fully present.
        """
        layouts = self._layer_names()
        if not keys or not layouts:
            return len(keys)
        per_chunk = [[f"{k}/r{r}/{layer}" for r, names in enumerate(layouts) for layer in names] for k in keys]
        flat = [x for group in per_chunk for x in group]
        present = self.client.exists(flat)
        n = 0
        pos = 0
        for group in per_chunk:
            if not all(present[pos : pos + len(group)]):
                break
            pos += len(group)
            n += 1
        if n:
            self.client.pin(flat[:pos], ttl_ms=PIN_TTL_MS)
        return n

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            total = num_external_tokens + int(getattr(request, "num_computed_tokens", 0) or 0)
            self._need_load[request.request_id] = max(1, total // self.chunk_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> InferaKvdConnectorMetadata:
        meta = InferaKvdConnectorMetadata()
        scheduled = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
        for new_req in getattr(scheduler_output, "scheduled_new_reqs", []) or []:
            rid = new_req.req_id
            retention = self._retention.get(rid, "long")
            tokens = list(new_req.prompt_token_ids)
            done = int(getattr(new_req, "num_computed_tokens", 0) or 0) + int(scheduled.get(rid, len(tokens)))
            meta.requests.append(
                ReqMeta(
                    req_id=rid,
                    token_ids=tokens,
                    block_ids=_block_ids(new_req.block_ids),
                    load_chunks=self._need_load.pop(rid, 0),
                    store=retention != "none",
                    retention=retention,
                    store_until=min(len(tokens), done) // self.chunk_tokens,
                )
            )
        self._need_load.clear()
        return meta

    def request_finished(self, request: Any, block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        self._retention.pop(request.request_id, None)
        # Saves complete synchronously in wait_for_save, so blocks can be freed at once.
        return False, None

    # -- worker side ---------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        self._kv_caches = dict(kv_caches)
        # Tells the scheduler side which layer keys make up a chunk (see _verify_and_pin).
        self.client.put([PutItem(f"layout/r{self.rank}", json.dumps(list(self._kv_caches)).encode(), retention="long")])

    def _chunk_blocks(self, meta: ReqMeta, i: int) -> List[int]:
        per = self.chunk_tokens // self.block_size
        return meta.block_ids[i * per : (i + 1) * per]

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        import torch  # type: ignore  # worker side only: vLLM always has torch

        md = self._get_connector_metadata()
        for req in md.requests:
            if req.load_chunks <= 0:
                continue
            keys = chunk_keys(req.token_ids, self.chunk_tokens)[: req.load_chunks]
            for layer_name, kv in self._kv_caches.items():
                got = self.client.get([f"{k}/r{self.rank}/{layer_name}" for k in keys])
                try:
                    for i, c in enumerate(got):
                        if c is None:
                            logger.warning("kvd chunk %s layer %s vanished before load", keys[i], layer_name)
                            continue
                        blocks = self._chunk_blocks(req, i)
                        # A CPU tensor over our own mapping of the arena: no socket copy.
                        src = torch.frombuffer(c.view, dtype=torch.uint8).view(kv.dtype)
                        shape = (kv.shape[0], len(blocks), *kv.shape[2:])
                        idx = torch.tensor(blocks, device=kv.device)
                        kv.index_copy_(1, idx, src.view(shape).to(kv.device))
                finally:
                    self.client.release(c.lease for c in got if c is not None)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # start_load_kv loads every layer synchronously; nothing is left to wait for.
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        import torch  # type: ignore

        md = self._get_connector_metadata()
        for req in md.requests:
            if not req.store:
                continue
            keys = chunk_keys(req.token_ids, self.chunk_tokens)[: req.store_until]
            items: List[PutItem] = []
            first = req.load_chunks  # loaded chunks are in kvd already
            for i, k in enumerate(keys):
                if i < first:
                    continue
                blocks = self._chunk_blocks(req, i)
                if len(blocks) * self.block_size < self.chunk_tokens:
                    break
                t = kv_layer[:, blocks].contiguous().cpu()
                data = memoryview(t.view(-1).view(torch.uint8).numpy())
                items.append(PutItem(f"{k}/r{self.rank}/{layer_name}", data, retention=req.retention))
            if items and self.client.arena is not None:
                self.client.put_arena(items)  # written straight into the shared arena
            elif items:
                self.client.put(items)
            if layer_name == next(iter(self._kv_caches), layer_name):
                self._saved.extend((f"{k}/r{self.rank}", req.retention) for k in keys[first : first + len(items)])

    def wait_for_save(self) -> None:
        if not self._saved:
            return
        self.client.put([PutItem(k, b"\x01", retention=r) for k, r in self._saved])
        self._saved.clear()

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        return None, None
