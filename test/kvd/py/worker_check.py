"""Worker side of InferaKvdConnector against the real daemon, with a numpy stand-in for torch:
save every layer of a prompt, LOOKUP it from the scheduler side, load it into other blocks."""

import json
import os
import sys
from types import SimpleNamespace

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, sys.argv[2])
sys.path.insert(0, os.path.join(here, "fake_torch"))

import numpy as np  # noqa: E402
import torch  # noqa: E402  (the stand-in)

from infera_kvd.connector import InferaKvdConnector  # noqa: E402

sock = sys.argv[1]
cfg = SimpleNamespace(
    kv_transfer_config=SimpleNamespace(kv_connector_extra_config={"infera_kvd_socket": sock, "infera_kvd_chunk_tokens": 32}),
    cache_config=SimpleNamespace(block_size=16),
    parallel_config=SimpleNamespace(tensor_parallel_size=1),
    model_config=SimpleNamespace(model="tiny-worker"),
)
sched = InferaKvdConnector(cfg, role=0)
worker_a = InferaKvdConnector(cfg, role=1)
worker_b = InferaKvdConnector(cfg, role=1)
rng = np.random.default_rng(3)
shape = (2, 8, 16, 2, 4)  # [k/v, blocks, block_size, heads, head_dim]
layers = ["model.layers.0.attn", "model.layers.1.attn"]
kv_a = {n: torch.Tensor(rng.standard_normal(shape).astype(np.float16)) for n in layers}
kv_b = {n: torch.Tensor(np.zeros(shape, dtype=np.float16)) for n in layers}
worker_a.register_kv_caches(kv_a)
worker_b.register_kv_caches(kv_b)
out = {}

tokens = list(range(1000, 1100))
req = SimpleNamespace(request_id="a", prompt_token_ids=tokens, kv_transfer_params={"infera_retention": "long"})
out["matched_cold"] = sched.get_num_new_matched_tokens(req, 0)[0]
md = sched.build_connector_meta(
    SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="a", prompt_token_ids=tokens, block_ids=([0, 1, 2, 3, 4, 5, 6],), num_computed_tokens=0)],
        num_scheduled_tokens={"a": 100},
    )
)
worker_a.bind_connector_metadata(md)
worker_a.start_load_kv(None)
for n in layers:
    worker_a.save_kv_layer(n, kv_a[n], None)
worker_a.wait_for_save()
worker_a.clear_connector_metadata()

req2 = SimpleNamespace(request_id="b", prompt_token_ids=tokens, kv_transfer_params={}, num_computed_tokens=0)
matched = sched.get_num_new_matched_tokens(req2, 0)[0]
out["matched_warm"] = matched
sched.update_state_after_alloc(req2, None, matched)
# Worker B gets the prompt in different blocks: chunk i lands in blocks [2i+1, 2i+2].
target = [1, 2, 3, 4, 5, 6, 7]
md2 = sched.build_connector_meta(
    SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="b", prompt_token_ids=tokens, block_ids=[target], num_computed_tokens=0)],
        num_scheduled_tokens={"b": 100 - matched},
    )
)
out["load_chunks"] = md2.requests[0].load_chunks
worker_b.bind_connector_metadata(md2)
worker_b.start_load_kv(None)
for n in layers:
    worker_b.wait_for_layer_load(n)
ok = True
for n in layers:
    a = kv_a[n].a
    b = kv_b[n].a
    ok = ok and np.array_equal(b[:, 1:7], a[:, 0:6])
    ok = ok and not b[:, 0].any() and not b[:, 7].any()
out["loaded_equal"] = bool(ok)

# retention none: nothing is saved.
req3 = SimpleNamespace(request_id="c", prompt_token_ids=list(range(5000, 5100)), kv_transfer_params={"infera_retention": "none"})
sched.get_num_new_matched_tokens(req3, 0)
md3 = sched.build_connector_meta(
    SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="c", prompt_token_ids=req3.prompt_token_ids, block_ids=[0, 1, 2, 3, 4, 5, 6], num_computed_tokens=0)],
        num_scheduled_tokens={"c": 100},
    )
)
worker_a.bind_connector_metadata(md3)
for n in layers:
    worker_a.save_kv_layer(n, kv_a[n], None)
worker_a.wait_for_save()
out["none_matched_after"] = sched.get_num_new_matched_tokens(req3, 0)[0]
out["stats_l2_chunks"] = sched.client.stats()["tiers"]["l2"]["chunks"]

# A layer chunk evicted while its marker survives: the scheduler must not promise it.
keys = __import__("infera_kvd.connector", fromlist=["chunk_keys"]).chunk_keys(tokens[:99], 32)
sched.client.delete([f"{keys[1]}/r0/{layers[1]}"])
out["matched_after_layer_loss"] = sched.get_num_new_matched_tokens(req2, 0)[0]
print(json.dumps(out))
