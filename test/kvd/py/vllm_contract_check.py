"""Loads InferaKvdConnector the way vLLM does, against the stand-in of vLLM's v1 connector
base and factory in fake_vllm/ (see the citations there), and checks the contract:

- the factory's constructor check (supports_kw(cls, "kv_cache_config")) passes and
  create_connector(config, role, kv_cache_config) builds it for both roles;
- ``role`` stays what vLLM passed (it is a read-only property: assigning it raises);
- no abstract method is left (the ABC would refuse to instantiate), and every method of the
  base the connector overrides accepts the base's call: same leading parameters in the same
  order, **kwargs kept where the base has them, anything extra optional.

Prints one JSON line; argv: <kvd socket> <python dir>.
"""

import inspect
import json
import os
import sys
from types import SimpleNamespace

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, sys.argv[2])
sys.path.insert(0, os.path.join(here, "fake_vllm"))

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole  # noqa: E402

out: dict = {}


def sig_compatible(base_fn, impl_fn) -> "str | None":
    """None when impl accepts every call the base's signature allows; else why not."""
    b = list(inspect.signature(base_fn).parameters.values())
    i = list(inspect.signature(impl_fn).parameters.values())
    P = inspect.Parameter
    b_pos = [p for p in b if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    i_pos = [p for p in i if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    if [p.name for p in i_pos[: len(b_pos)]] != [p.name for p in b_pos]:
        return f"positional {[p.name for p in i_pos]} vs base {[p.name for p in b_pos]}"
    for p in i_pos[len(b_pos) :]:
        if p.default is P.empty:
            return f"extra required positional {p.name}"
    for p in i:
        if p.kind == P.KEYWORD_ONLY and p.default is P.empty:
            return f"extra required keyword {p.name}"
    if any(p.kind == P.VAR_KEYWORD for p in b) and not any(p.kind == P.VAR_KEYWORD for p in i):
        return "base takes **kwargs, override does not"
    if any(p.kind == P.VAR_POSITIONAL for p in b) and not any(p.kind == P.VAR_POSITIONAL for p in i):
        return "base takes *args, override does not"
    return None


ktc = SimpleNamespace(
    kv_connector="InferaKvdConnector",
    kv_connector_module_path="infera_kvd.connector",
    engine_id="e0",
    kv_connector_extra_config={"infera_kvd_socket": sys.argv[1], "infera_kvd_chunk_tokens": 32},
)
cfg = SimpleNamespace(
    kv_transfer_config=ktc,
    scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=True),
    cache_config=SimpleNamespace(block_size=16),
    parallel_config=SimpleNamespace(tensor_parallel_size=1),
    model_config=SimpleNamespace(model="contract"),
)
kv_cache_config = SimpleNamespace(num_blocks=8, kv_cache_groups=[])

try:
    cls = KVConnectorFactory.get_connector_class(ktc)
    out["class_check"] = "ok"
except Exception as e:  # noqa: BLE001
    out["class_check"] = f"{type(e).__name__}: {e}"
    cls = None

if cls is not None:
    import infera_kvd.connector as mod

    out["have_vllm"] = mod.HAVE_VLLM
    out["subclass"] = issubclass(cls, KVConnectorBase_V1)
    out["abstract_left"] = sorted(getattr(cls, "__abstractmethods__", ()))
    roles = {}
    for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        try:
            c = KVConnectorFactory.create_connector(cfg, role, kv_cache_config)
            roles[role.name] = {
                "role": c.role.name if isinstance(c.role, KVConnectorRole) else repr(c.role),
                "kv_cache_config_kept": c._kv_cache_config is kv_cache_config,
            }
        except Exception as e:  # noqa: BLE001
            roles[role.name] = {"error": f"{type(e).__name__}: {e}"}
    out["roles"] = roles
    # The base's abstract methods, and every other base method the connector overrides.
    checked = {}
    for name, base_fn in inspect.getmembers(KVConnectorBase_V1, predicate=inspect.isfunction):
        if name == "__init__":
            continue
        impl_fn = getattr(cls, name, None)
        is_abstract = getattr(base_fn, "__isabstractmethod__", False)
        if impl_fn is base_fn and not is_abstract:
            continue
        if impl_fn is None or getattr(impl_fn, "__isabstractmethod__", False):
            checked[name] = "missing"
            continue
        checked[name] = sig_compatible(base_fn, impl_fn) or "ok"
    out["methods"] = checked
    out["abstract_in_base"] = sorted(KVConnectorBase_V1.__abstractmethods__)
    # A 2-argument connector is refused by the same check (the check itself works).
    class Old(KVConnectorBase_V1):  # noqa: D401
        def __init__(self, vllm_config, role):  # type: ignore[no-untyped-def]
            super().__init__(vllm_config, role, None)

    sys.modules["old_conn"] = SimpleNamespace(Old=Old)  # type: ignore[assignment]
    try:
        KVConnectorFactory.get_connector_class(SimpleNamespace(kv_connector="Old", kv_connector_module_path="old_conn"))
        out["old_refused"] = False
    except ValueError:
        out["old_refused"] = True

print(json.dumps(out))
