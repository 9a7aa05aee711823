from .base import KVConnectorBase_V1, KVConnectorRole, SupportsHMA, supports_hma  # noqa: F401
