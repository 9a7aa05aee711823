/**
 * The L2 shared arena ("CopyFree"): one memfd, sized once, sealed against shrinking and
 * growing, mapped MAP_SHARED by the daemon and by every client that received the fd over
 * SCM_RIGHTS. Because both sides map the same pages, a GET is answered with an offset and a
 * length: the client reads the bytes from its own mapping, nothing crosses the socket.
 *
 * Sealing matters for safety, not only hygiene: a client that holds a mapping would take
 * SIGBUS if the file shrank underneath it, so F_SEAL_SHRINK|F_SEAL_GROW makes the size a
 * promise the daemon cannot break by accident either.
 */
import {
  F_ADD_SEALS,
  F_SEAL_GROW,
  F_SEAL_SHRINK,
  isMapFailed,
  libc,
  MAP_SHARED,
  MFD_ALLOW_SEALING,
  MFD_CLOEXEC,
  PROT_READ,
  PROT_WRITE,
  viewOf,
} from "./native/libc.ts";

export interface ArenaMapping {
  /** The memfd (daemon: the one it created; client: the one it received). */
  readonly fd: number;
  readonly bytes: number;
  /** A Buffer aliasing the whole mapping. */
  readonly buf: Buffer;
  /**
   * Closes the fd and, unless `unmap` is false, unmaps. Keep the mapping when Buffers over it
   * may still be referenced (touching unmapped memory is a SIGSEGV, not an exception).
   */
  close(unmap?: boolean): void;
}

function mapFd(fd: number, bytes: number, ownsFd: boolean): ArenaMapping {
  const c = libc();
  const ptr = c.mmap(null, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (isMapFailed(ptr)) throw new Error(`mmap of ${bytes} bytes failed (errno ${c.errno()})`);
  const buf = viewOf(ptr, bytes);
  let closed = false;
  return {
    fd,
    bytes,
    buf,
    close(unmap = true) {
      if (closed) return;
      closed = true;
      if (unmap) c.munmap(ptr, bytes);
      if (ownsFd) c.close(fd);
    },
  };
}

/** Creates the daemon's arena: memfd_create + ftruncate + seal + mmap(MAP_SHARED). */
export function createArena(bytes: number, name = "infera-kvd"): ArenaMapping {
  if (!Number.isSafeInteger(bytes) || bytes <= 0) throw new Error(`bad arena size ${bytes}`);
  const c = libc();
  const fd = c.memfdCreate(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) throw new Error(`memfd_create failed (errno ${c.errno()})`);
  if (c.ftruncate(fd, bytes) !== 0) {
    const e = c.errno();
    c.close(fd);
    throw new Error(`ftruncate(${bytes}) failed (errno ${e})`);
  }
  if (c.fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) !== 0) {
    const e = c.errno();
    c.close(fd);
    throw new Error(`F_ADD_SEALS failed (errno ${e})`);
  }
  return mapFd(fd, bytes, true);
}

/** Maps an arena fd received from the daemon. Takes ownership of `fd`. */
export function mapArena(fd: number, bytes: number): ArenaMapping {
  return mapFd(fd, bytes, true);
}
