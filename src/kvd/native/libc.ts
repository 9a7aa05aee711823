/**
 * The handful of libc calls kvd needs that Node 20 does not expose: memfd_create, ftruncate,
 * mmap/munmap, fcntl(F_ADD_SEALS), dup, close, posix_fadvise, and SO_SNDBUF on a Unix socket.
 *
 * Why koffi (an FFI) rather than a small N-API addon: koffi ships prebuilt binaries for
 * Node 20 on linux-x64/arm64, so there is no node-gyp/compiler step on install or in CI, and
 * these calls are plain scalar-in/scalar-out functions with no callbacks or structs, which
 * is exactly the case where an FFI is safe and cheap (each call happens once per arena or per
 * file, never per byte). The library is loaded lazily so that importing kvd modules on a
 * machine without libc.so.6 (macOS) does not throw until a memfd is actually needed.
 */
import koffi from "koffi";

type IntFn = (...args: unknown[]) => number;

interface Libc {
  memfdCreate: (name: string, flags: number) => number;
  ftruncate: (fd: number, len: number) => number;
  mmap: (addr: null, len: number, prot: number, flags: number, fd: number, off: number) => unknown;
  munmap: (addr: unknown, len: number) => number;
  fcntl: (fd: number, cmd: number, arg: number) => number;
  dup: (fd: number) => number;
  close: (fd: number) => number;
  fadvise: (fd: number, off: number, len: number, advice: number) => number;
  setsockopt: (fd: number, level: number, name: number, val: Buffer, len: number) => number;
  getsockopt: (fd: number, level: number, name: number, val: Buffer, len: number[]) => number;
  errno: () => number;
}

export const MFD_CLOEXEC = 0x0001;
export const MFD_ALLOW_SEALING = 0x0002;
export const F_ADD_SEALS = 1033;
export const F_GET_SEALS = 1034;
export const F_SEAL_SHRINK = 0x0002;
export const F_SEAL_GROW = 0x0004;
export const PROT_READ = 0x1;
export const PROT_WRITE = 0x2;
export const MAP_SHARED = 0x01;
export const POSIX_FADV_DONTNEED = 4;
export const SOL_SOCKET = 1;
export const SO_SNDBUF = 7;

let cached: Libc | null = null;

export function libc(): Libc {
  if (cached) return cached;
  const lib = koffi.load("libc.so.6");
  const errnoLoc = lib.func("int *__errno_location()") as () => unknown;
  cached = {
    memfdCreate: lib.func("int memfd_create(const char *name, unsigned int flags)") as Libc["memfdCreate"],
    ftruncate: lib.func("int ftruncate(int fd, int64_t len)") as IntFn,
    mmap: lib.func(
      "void *mmap(void *addr, size_t len, int prot, int flags, int fd, int64_t off)",
    ) as Libc["mmap"],
    munmap: lib.func("int munmap(void *addr, size_t len)") as IntFn,
    fcntl: lib.func("int fcntl(int fd, int cmd, int arg)") as IntFn,
    dup: lib.func("int dup(int fd)") as IntFn,
    close: lib.func("int close(int fd)") as IntFn,
    fadvise: lib.func("int posix_fadvise(int fd, int64_t off, int64_t len, int advice)") as IntFn,
    setsockopt: lib.func(
      "int setsockopt(int fd, int level, int name, const void *val, uint32_t len)",
    ) as Libc["setsockopt"],
    getsockopt: lib.func(
      "int getsockopt(int fd, int level, int name, _Out_ void *val, _Inout_ uint32_t *len)",
    ) as Libc["getsockopt"],
    errno: () => koffi.decode(errnoLoc(), "int") as number,
  };
  return cached;
}

/** mmap returns MAP_FAILED ((void*)-1) on error. */
export function isMapFailed(ptr: unknown): boolean {
  if (ptr === null || ptr === undefined) return true;
  const addr = typeof ptr === "bigint" ? ptr : koffi.address(ptr);
  return addr === 0xffffffffffffffffn || addr === -1n || addr === 0n;
}

/** A Buffer that aliases `len` bytes of native memory at `ptr` (no copy). */
export function viewOf(ptr: unknown, len: number): Buffer {
  return Buffer.from(koffi.view(ptr, len));
}
