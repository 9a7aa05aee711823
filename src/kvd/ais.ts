/**
 * AIS / hipFile probe (GPU-direct L3 reads on AMD). Only attempted when INFERA_KVD_AIS=1.
 * The result is logged and reported in STATS/`/metrics` either way, so the daemon never
 * claims GPU-direct I/O it does not have.
 */
import koffi from "koffi";

export interface AisStatus {
  requested: boolean;
  /** The hipFile library loaded and exposes the driver entry points. */
  available: boolean;
  /** Whether L3 I/O actually goes through hipFile in this process. */
  active: boolean;
  library: string | null;
  reason: string;
}

const CANDIDATES = [
  "libhipfile.so",
  "libhipfile.so.0",
  "/opt/rocm/lib/libhipfile.so",
  "/opt/rocm/lib/libhipfile.so.0",
];

export function probeAis(requested: boolean): AisStatus {
  if (!requested) {
    return {
      requested,
      available: false,
      active: false,
      library: null,
      reason: "INFERA_KVD_AIS is not 1: GPU-direct L3 path not requested; L3 uses POSIX file I/O",
    };
  }
  const errors: string[] = [];
  for (const lib of CANDIDATES) {
    try {
      const h = koffi.load(lib);
      let hasDriver = false;
      try {
        hasDriver = h.func("int hipFileDriverOpen()") !== undefined;
      } catch {
        hasDriver = false;
      }
      if (!hasDriver) {
        errors.push(`${lib}: loaded but has no hipFileDriverOpen`);
        continue;
      }
      // kvd's chunks live in host RAM (the arena); GPU-direct needs the engine's device
      // buffers registered with hipFile on the engine side. The daemon can only report that
      // the library is there: the engine-side connector is what would use it.
      return {
        requested,
        available: true,
        active: false,
        library: lib,
        reason:
          "hipFile found; the daemon serves L3 from host RAM, GPU-direct reads are for an engine-side " +
          "loader with registered device buffers, which this build does not include",
      };
    } catch (e) {
      errors.push(`${lib}: ${String((e as Error).message ?? e).split("\n")[0]}`);
    }
  }
  return {
    requested,
    available: false,
    active: false,
    library: null,
    reason: `hipFile library not found (${errors.join("; ")}); L3 uses POSIX file I/O`,
  };
}
