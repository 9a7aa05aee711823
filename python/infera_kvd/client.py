"""Stdlib-only kvd client: Unix socket, SCM_RIGHTS fd receive, mmap of the shared arena.

A GET over the Unix socket answers offsets into the arena; `Chunk.view` is a memoryview of
this process's own mapping, so the bytes are never copied over the socket. Leases keep the
daemon from reusing that memory until `release()`.
"""

from __future__ import annotations

import json
import mmap
import os
import socket
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .protocol import FLAG_ERROR, HEADER_BYTES, KvdError, KvdProtocolError, Op, encode_frame, parse_header


@dataclass
class Chunk:
    key: str
    tier: str
    view: memoryview
    offset: int  # -1 when the bytes came inline (copy path or RAM full)
    lease: int


@dataclass
class PutItem:
    key: str
    data: bytes
    retention: Optional[str] = None  # none | short | long
    ttl_ms: Optional[int] = None


class KvdClient:
    def __init__(
        self,
        socket_path: Optional[str] = None,
        tcp: Optional[Tuple[str, int]] = None,
        namespace: Optional[str] = None,
        arena: bool = True,
        timeout: float = 30.0,
        token: Optional[str] = None,
    ) -> None:
        if not socket_path and not tcp:
            raise ValueError("KvdClient needs socket_path or tcp")
        self.namespace = namespace
        self._next_id = 1
        self._mm: Optional[mmap.mmap] = None
        self.arena: Optional[memoryview] = None
        if socket_path:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(timeout)
        self._sock.connect(socket_path or tcp)  # type: ignore[arg-type]
        want_arena = bool(arena and socket_path)
        hello: Dict[str, Any] = {"namespace": namespace, "arena": want_arena, "client": "infera-python"}
        # The daemon's TCP token (INFERA_KVD_TCP_TOKEN); the Unix socket needs none.
        if token is None and tcp:
            token = os.environ.get("INFERA_KVD_TCP_TOKEN")
        if token is not None:
            hello["token"] = token
        self._send(encode_frame(Op.HELLO, 0, hello))
        fds: List[int] = []
        _op, flags, _id, meta, _data = self._recv_frame(fds if want_arena else None)
        if flags & FLAG_ERROR:
            err = meta.get("error") or {}
            self._sock.close()
            raise KvdError(int(meta.get("status", 500)), err.get("code"), err.get("message", str(meta)))
        self.hello = meta
        if want_arena:
            if not meta.get("arena") or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                raise KvdProtocolError("kvd did not pass the arena fd")
            size = int(meta["arena_bytes"])
            try:
                self._mm = mmap.mmap(fds[0], size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fds[0])  # the mapping keeps the memory alive
            self.arena = memoryview(self._mm)

    # -- framing -------------------------------------------------------------------------
    def _send(self, parts: Sequence[bytes]) -> None:
        for p in parts:
            if len(p):
                self._sock.sendall(p)

    def _recv_exact(self, n: int, fds: Optional[List[int]] = None) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            if fds is not None and got == 0:
                # The arena fd rides on the first bytes of the HELLO reply.
                data, new_fds, _flags, _addr = socket.recv_fds(self._sock, n, 4)
                fds.extend(new_fds)
                if not data:
                    raise ConnectionError("kvd closed the connection")
                view[: len(data)] = data
                got += len(data)
                continue
            k = self._sock.recv_into(view[got:], n - got)
            if k == 0:
                raise ConnectionError("kvd closed the connection")
            got += k
        return buf

    def _recv_frame(self, fds: Optional[List[int]] = None) -> Tuple[int, int, int, Dict[str, Any], memoryview]:
        head = self._recv_exact(HEADER_BYTES, fds)
        op, flags, req_id, meta_len, data_len = parse_header(bytes(head))
        body = self._recv_exact(meta_len + data_len) if meta_len + data_len else bytearray()
        meta = json.loads(bytes(body[:meta_len])) if meta_len else {}
        return op, flags, req_id, meta, memoryview(body)[meta_len:]

    def request(self, op: int, meta: Dict[str, Any], data: Sequence[bytes] = ()) -> Tuple[Dict[str, Any], memoryview]:
        req_id = self._next_id
        self._next_id = (self._next_id + 1) & 0xFFFFFFFF or 1
        self._send(encode_frame(op, req_id, meta, data))
        _op, flags, rid, rmeta, rdata = self._recv_frame()
        if rid != req_id:
            raise KvdProtocolError(f"response id {rid} != request id {req_id}")
        if flags & FLAG_ERROR:
            err = rmeta.get("error", {})
            raise KvdError(int(rmeta.get("status", 500)), err.get("code"), err.get("message", "kvd error"))
        return rmeta, rdata

    # -- operations ------------------------------------------------------------------------
    @staticmethod
    def _items(items: Iterable[PutItem]) -> List[Dict[str, Any]]:
        return [
            {k: v for k, v in {"key": i.key, "size": len(i.data), "retention": i.retention, "ttl_ms": i.ttl_ms}.items() if v is not None}
            for i in items
        ]

    def put(self, items: Sequence[PutItem], ns: Optional[str] = None) -> List[bool]:
        meta, _ = self.request(Op.PUT, {"ns": ns, "items": self._items(items)}, [i.data for i in items])
        return list(meta["stored"])

    def put_arena(self, items: Sequence[PutItem], ns: Optional[str] = None) -> List[bool]:
        """Zero-copy PUT: ALLOC arena space, write through our mapping, COMMIT."""
        if self.arena is None:
            raise RuntimeError("put_arena needs the arena (Unix socket)")
        meta, _ = self.request(Op.ALLOC, {"ns": ns, "items": self._items(items)})
        handles = []
        for item, a in zip(items, meta["allocs"]):
            if a is None:
                continue
            off = int(a["offset"])
            self.arena[off : off + len(item.data)] = item.data
            handles.append(int(a["handle"]))
        cmeta, _ = self.request(Op.COMMIT, {"handles": handles})
        committed = iter(cmeta["committed"])
        return [bool(next(committed)) if a is not None else False for a in meta["allocs"]]

    def get(self, keys: Sequence[str], ns: Optional[str] = None, copy: bool = False) -> List[Optional[Chunk]]:
        meta, data = self.request(Op.GET, {"ns": ns, "keys": list(keys), "copy": copy or None})
        out: List[Optional[Chunk]] = []
        pos = 0
        for key, it in zip(keys, meta["items"]):
            if not it["found"]:
                out.append(None)
                continue
            size = int(it["size"])
            if it.get("inline") or self.arena is None:
                out.append(Chunk(key, it["tier"], data[pos : pos + size], -1, 0))
                pos += size
            else:
                off = int(it["offset"])
                out.append(Chunk(key, it["tier"], self.arena[off : off + size], off, int(it["lease"])))
        return out

    def get_copy(self, keys: Sequence[str], ns: Optional[str] = None) -> List[Optional[bytes]]:
        return [bytes(c.view) if c else None for c in self.get(keys, ns, copy=True)]

    def release(self, leases: Iterable[int]) -> int:
        real = [int(x) for x in leases if x]
        if not real:
            return 0
        meta, _ = self.request(Op.RELEASE, {"leases": real})
        return int(meta["released"])

    def exists(self, keys: Sequence[str], ns: Optional[str] = None) -> List[Optional[str]]:
        meta, _ = self.request(Op.EXISTS, {"ns": ns, "keys": list(keys)})
        return list(meta["tiers"])

    def lookup(self, keys: Sequence[str], ns: Optional[str] = None) -> int:
        meta, _ = self.request(Op.LOOKUP, {"ns": ns, "keys": list(keys)})
        return int(meta["prefix"])

    def delete(self, keys: Sequence[str], ns: Optional[str] = None) -> List[bool]:
        meta, _ = self.request(Op.DELETE, {"ns": ns, "keys": list(keys)})
        return list(meta["deleted"])

    def pin(self, keys: Sequence[str], ttl_ms: Optional[int] = None, ns: Optional[str] = None) -> List[bool]:
        meta, _ = self.request(Op.PIN, {"ns": ns, "keys": list(keys), "ttl_ms": ttl_ms})
        return list(meta["pinned"])

    def unpin(self, keys: Sequence[str], ns: Optional[str] = None) -> List[bool]:
        meta, _ = self.request(Op.UNPIN, {"ns": ns, "keys": list(keys)})
        return list(meta["unpinned"])

    def stats(self) -> Dict[str, Any]:
        meta, _ = self.request(Op.STATS, {})
        return meta

    def close(self) -> None:
        try:
            self._sock.close()
        finally:
            if self.arena is not None:
                try:
                    self.arena.release()
                except BufferError:
                    pass
                self.arena = None
            if self._mm is not None:
                try:
                    self._mm.close()
                except BufferError:
                    pass  # a caller still holds a view; the mapping goes with the process
                self._mm = None

    def __enter__(self) -> "KvdClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
