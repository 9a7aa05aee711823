"""Drives the real daemon from Python: run by test/kvd/python.test.ts with the socket path."""

import json
import sys
from types import SimpleNamespace

sys.path.insert(0, sys.argv[2])

from infera_kvd import KvdClient, KvdError, PutItem  # noqa: E402
from infera_kvd.connector import HAVE_VLLM, InferaKvdConnector, chunk_keys  # noqa: E402

sock = sys.argv[1]
out = {}

with KvdClient(socket_path=sock, namespace="py") as c:
    out["arena_bytes"] = len(c.arena)
    data = bytes(range(256)) * 4096  # 1 MiB
    out["put"] = c.put([PutItem("a", data, retention="short"), PutItem("n", b"x", retention="none")])
    out["put_arena"] = c.put_arena([PutItem("b", b"\x07" * 65536)])
    chunks = c.get(["a", "b", "missing"])
    a, b, missing = chunks
    out["zero_copy"] = a is not None and a.offset >= 0 and a.view.obj is c._mm
    out["a_ok"] = bytes(a.view) == data
    out["b_ok"] = bytes(b.view) == b"\x07" * 65536
    out["missing"] = missing is None
    out["tiers"] = [a.tier, b.tier]
    # Write through our own mapping; the daemon (another process) then serves those bytes.
    a.view[0:4] = b"PYTH"
    out["copy_sees_mapping_write"] = c.get_copy(["a"])[0][:4] == b"PYTH"
    out["released"] = c.release([a.lease, b.lease])
    out["lookup"] = c.lookup(["a", "b", "zzz", "a"])
    out["exists"] = c.exists(["a", "n"])
    try:
        c.get(["a"], ns="other")
        out["ns_forbidden"] = False
    except KvdError as e:
        out["ns_forbidden"] = e.status == 403 and e.code == "namespace_forbidden"

# The connector's scheduler side against the real daemon (worker side needs torch + vLLM).
cfg = SimpleNamespace(
    kv_transfer_config=SimpleNamespace(kv_connector_extra_config={"infera_kvd_socket": sock, "infera_kvd_chunk_tokens": 32}),
    cache_config=SimpleNamespace(block_size=16),
    parallel_config=SimpleNamespace(tensor_parallel_size=1),
    model_config=SimpleNamespace(model="tiny"),
)
conn = InferaKvdConnector(cfg, role=0)
tokens = list(range(100))
keys = chunk_keys(tokens, 32)
out["n_keys"] = len(keys)
req = SimpleNamespace(request_id="r1", prompt_token_ids=tokens, kv_transfer_params={"infera_retention": "short"}, num_computed_tokens=0)
out["matched_before"] = conn.get_num_new_matched_tokens(req, 0)[0]
# What wait_for_save writes after a forward pass saved every layer: the per-rank markers.
conn.client.put([PutItem(f"{k}/r0", b"\x01", retention="short") for k in keys[:2]])
out["matched_after"] = conn.get_num_new_matched_tokens(req, 0)[0]
out["matched_after_computed"] = conn.get_num_new_matched_tokens(req, 16)[0]
conn.update_state_after_alloc(req, None, out["matched_after"])
so = SimpleNamespace(
    scheduled_new_reqs=[SimpleNamespace(req_id="r1", prompt_token_ids=tokens, block_ids=([0, 1, 2, 3, 4, 5, 6],), num_computed_tokens=0)],
    num_scheduled_tokens={"r1": 100},
)
md = conn.build_connector_meta(so)
r = md.requests[0]
out["meta"] = {"load_chunks": r.load_chunks, "store": r.store, "retention": r.retention, "blocks": r.block_ids, "store_until": r.store_until}
# Chunked prefill: only 40 of 100 tokens scheduled this step -> one full chunk has KV.
so2 = SimpleNamespace(
    scheduled_new_reqs=[SimpleNamespace(req_id="r3", prompt_token_ids=tokens, block_ids=[0, 1, 2], num_computed_tokens=0)],
    num_scheduled_tokens={"r3": 40},
)
out["store_until_partial"] = conn.build_connector_meta(so2).requests[0].store_until
req_none = SimpleNamespace(request_id="r2", prompt_token_ids=tokens, kv_transfer_params={"infera_retention": "none"})
conn.get_num_new_matched_tokens(req_none, 0)
md2 = conn.build_connector_meta(SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(req_id="r2", prompt_token_ids=tokens, block_ids=[0])]))
out["none_store"] = md2.requests[0].store
out["request_finished"] = list(conn.request_finished(req, [0, 1]))
out["get_finished"] = list(conn.get_finished({"r1"}))
out["have_vllm"] = HAVE_VLLM
for m in ["get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta", "request_finished",
          "register_kv_caches", "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save", "get_finished"]:
    assert callable(getattr(conn, m)), m
conn.client.close()
print(json.dumps(out))
