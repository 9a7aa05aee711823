"""Stand-in for vLLM's KVConnectorBase_V1, with only what a connector's loading depends on.

Reproduces vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/base.py
@ 003df2961dd8830c317a61f9745ccd557da9fa06:
- the constructor ``__init__(self, vllm_config, role, kv_cache_config)`` (kv_cache_config is
  required; a vllm_config without kv_transfer_config is a ValueError);
- ``role`` as a read-only property over ``_role`` (assigning ``self.role`` raises
  AttributeError, as it does in vLLM);
- every @abstractmethod with its exact parameter list (type annotations are strings here so
  that torch and vLLM's own types need not be importable);
- the non-abstract methods a connector commonly overrides, with their parameter lists, so
  overrides can be checked for compatibility;
- KVConnectorRole, KVConnectorMetadata, SupportsHMA/supports_hma.
"""

import enum
from abc import ABC, abstractmethod
from typing import Any


class SupportsHMA(ABC):
    @abstractmethod
    def request_finished_all_groups(self, request: "Request", block_ids: "tuple[list[int], ...]") -> "tuple[bool, dict[str, Any] | None]":
        raise NotImplementedError


def supports_hma(connector: Any) -> bool:
    if isinstance(connector, type):
        return issubclass(connector, SupportsHMA)
    return isinstance(connector, SupportsHMA)


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(ABC):  # noqa: B024
    pass


class KVConnectorBase_V1(ABC):
    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"):
        self._connector_metadata: "KVConnectorMetadata | None" = None
        self._vllm_config = vllm_config
        if vllm_config.kv_transfer_config is not None:
            self._kv_transfer_config = vllm_config.kv_transfer_config
        else:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._kv_cache_config = kv_cache_config
        self._role = role
        self.use_eagle_prefix_cache_hashing = False

    @property
    def role(self) -> KVConnectorRole:
        return self._role

    # -- worker side ----------------------------------------------------------------------
    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> KVConnectorMetadata:
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches: "dict[str, torch.Tensor]"):
        return

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata):
        return

    @abstractmethod
    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        pass

    @abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    @abstractmethod
    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: "torch.Tensor",
        attn_metadata: "AttentionMetadata",
        **kwargs: Any,
    ) -> None:
        pass

    @abstractmethod
    def wait_for_save(self):
        pass

    def get_finished(self, finished_req_ids: "set[str]") -> "tuple[set[str] | None, set[str] | None]":
        return None, None

    def get_block_ids_with_load_errors(self) -> "set[int]":
        return set()

    def shutdown(self):
        return None

    # -- scheduler side -------------------------------------------------------------------
    @abstractmethod
    def get_num_new_matched_tokens(
        self,
        request: "Request",
        num_computed_tokens: int,
    ) -> "tuple[int | None, bool]":
        pass

    @abstractmethod
    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        pass

    @abstractmethod
    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        pass

    def on_new_request(self, request: "Request") -> None:
        return

    def update_connector_output(self, connector_output: "KVConnectorOutput"):
        return

    def request_finished(
        self,
        request: "Request",
        block_ids: "list[int]",
    ) -> "tuple[bool, dict[str, Any] | None]":
        return False, None

    def take_events(self) -> "Iterable[KVCacheEvent]":
        return ()

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig") -> "str | None":
        if cls is KVConnectorBase_V1:
            raise TypeError("get_required_kvcache_layout should not be called on the abstract base class")
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: "dict[str, Any]") -> bool:
        return False
