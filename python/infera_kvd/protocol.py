"""kvd wire protocol (see docs/kvd-protocol.md). Mirrors src/kvd/protocol.ts."""

from __future__ import annotations

import json
import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple

MAGIC = 0x3144564B
HEADER = struct.Struct("<IBBHIII")
HEADER_BYTES = HEADER.size  # 20
FLAG_RESPONSE = 0x1
FLAG_ERROR = 0x2


class Op:
    HELLO = 1
    PUT = 2
    ALLOC = 3
    COMMIT = 4
    GET = 5
    EXISTS = 6
    LOOKUP = 7
    DELETE = 8
    PIN = 9
    UNPIN = 10
    RELEASE = 11
    STATS = 12


class KvdError(Exception):
    """An error frame from the daemon (OpenAI-shaped error body)."""

    def __init__(self, status: int, code: Optional[str], message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class KvdProtocolError(Exception):
    """The byte stream from the daemon is not a valid frame sequence."""


def encode_frame(op: int, req_id: int, meta: Dict[str, Any], data: Sequence[bytes] = ()) -> List[bytes]:
    meta_b = json.dumps({k: v for k, v in meta.items() if v is not None}, separators=(",", ":")).encode()
    data_len = sum(len(d) for d in data)
    head = HEADER.pack(MAGIC, op, 0, 0, req_id & 0xFFFFFFFF, len(meta_b), data_len)
    return [head, meta_b, *data]


def parse_header(head: bytes) -> Tuple[int, int, int, int, int]:
    magic, op, flags, _res, req_id, meta_len, data_len = HEADER.unpack(head)
    if magic != MAGIC:
        raise KvdProtocolError("bad magic")
    return op, flags, req_id, meta_len, data_len
