"""infera_kvd: the engine-side client of `infera kvd` (stdlib only) and a vLLM KV connector."""

from .client import Chunk, KvdClient, PutItem
from .protocol import KvdError, KvdProtocolError, Op

__all__ = ["Chunk", "KvdClient", "PutItem", "KvdError", "KvdProtocolError", "Op", "InferaKvdConnector"]


def __getattr__(name: str):
    # The connector imports vLLM-facing code; load it only when asked for.
    if name == "InferaKvdConnector":
        from .connector import InferaKvdConnector

        return InferaKvdConnector
    raise AttributeError(name)
