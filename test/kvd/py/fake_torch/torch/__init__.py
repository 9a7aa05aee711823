"""A tiny numpy-backed stand-in for the few torch calls InferaKvdConnector's worker side
makes (test only: lets the save → LOOKUP → load path run against the real daemon here,
where torch is not installed)."""

import numpy as np

uint8 = np.dtype(np.uint8)
float16 = np.dtype(np.float16)


class Tensor:
    def __init__(self, a):
        self.a = a
        self.device = "cpu"

    @property
    def shape(self):
        return self.a.shape

    @property
    def dtype(self):
        return self.a.dtype

    def __getitem__(self, idx):
        return Tensor(self.a[idx])

    def contiguous(self):
        return Tensor(np.ascontiguousarray(self.a))

    def cpu(self):
        return self

    def to(self, device):
        return self

    def view(self, *args):
        if len(args) == 1 and isinstance(args[0], np.dtype):
            return Tensor(self.a.view(args[0]))
        shape = args[0] if len(args) == 1 and isinstance(args[0], tuple) else args
        return Tensor(self.a.reshape(shape))

    def numpy(self):
        return self.a

    def index_copy_(self, dim, index, source):
        assert dim == 1
        self.a[:, index.a] = source.a
        return self


def frombuffer(buf, dtype):
    return Tensor(np.frombuffer(buf, dtype=dtype))


def tensor(values, device=None):
    return Tensor(np.array(values, dtype=np.int64))
