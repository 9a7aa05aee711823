"""Stand-in for vLLM's KVConnectorFactory: how an external connector (kv_connector_module_path)
is loaded, checked and constructed.

- vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/factory.py
  @ a4cd9d0d28bdb41db8dfe0acdafac2bf2f608630: create_connector(config, role, kv_cache_config)
  refuses a connector without SupportsHMA while the hybrid KV cache manager is on, and builds
  ``connector_cls(config, role, kv_cache_config)`` when ``supports_kw(connector_cls,
  "kv_cache_config")`` (a 2-argument class only got a deprecation warning there).
- The newer factory text in the code index (same file, later revision; it also has
  ``kv_connector_selection``) turned that warning into a ValueError at config time:
  "Connector X uses deprecated 2-argument constructor signature. External v1 KV connectors
  must accept kv_cache_config as the third constructor argument and pass it to
  super().__init__()", and always calls ``connector_cls(config, role, kv_cache_config)``.
  The stand-in follows the newer, stricter behaviour.
"""

import importlib
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole, supports_hma
from vllm.utils.func_utils import supports_kw


class KVConnectorFactory:
    _registry: "dict[str, Any]" = {}

    @classmethod
    def create_connector(cls, config: Any, role: KVConnectorRole, kv_cache_config: Any) -> Any:
        kv_transfer_config = config.kv_transfer_config
        if kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set to create a connector")
        connector_cls = cls.get_connector_class(kv_transfer_config)
        hma_enabled = not config.scheduler_config.disable_hybrid_kv_cache_manager
        if hma_enabled and not supports_hma(connector_cls):
            raise ValueError(
                f"Connector {connector_cls.__name__} does not support HMA but "
                f"HMA is enabled. Please set `--disable-hybrid-kv-cache-manager`."
            )
        return connector_cls(config, role, kv_cache_config)

    @classmethod
    def get_connector_class(cls, kv_transfer_config: Any) -> Any:
        connector_name = kv_transfer_config.kv_connector
        if connector_name is None:
            raise ValueError("Connector name is not set in KVTransferConfig")
        connector_module_path = kv_transfer_config.kv_connector_module_path
        if connector_module_path is not None and not connector_module_path:
            raise ValueError("kv_connector_module_path cannot be an empty string.")
        if connector_module_path:
            connector_module = importlib.import_module(connector_module_path)
            try:
                connector_cls = getattr(connector_module, connector_name)
            except AttributeError as e:
                raise AttributeError(f"Class {connector_name} not found in {connector_module_path}") from e
            if not supports_kw(connector_cls, "kv_cache_config"):
                raise ValueError(
                    f"Connector {connector_cls.__name__} uses deprecated "
                    "2-argument constructor signature. External v1 KV "
                    "connectors must accept kv_cache_config as the third "
                    "constructor argument and pass it to super().__init__()."
                )
        elif connector_name in cls._registry:
            connector_cls = cls._registry[connector_name]()
        else:
            raise ValueError(f"Unsupported connector type: {connector_name}")
        return connector_cls
