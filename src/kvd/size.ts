/** Parses byte sizes such as `4096`, `64MiB`, `1GiB`, `512k`, `2G` (binary multiples for all suffixes). */
const UNITS: Record<string, number> = {
  "": 1,
  b: 1,
  k: 1024,
  kb: 1024,
  kib: 1024,
  m: 1024 ** 2,
  mb: 1024 ** 2,
  mib: 1024 ** 2,
  g: 1024 ** 3,
  gb: 1024 ** 3,
  gib: 1024 ** 3,
  t: 1024 ** 4,
  tb: 1024 ** 4,
  tib: 1024 ** 4,
};

export function parseSize(text: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(text);
  const unit = m ? UNITS[m[2]!.toLowerCase()] : undefined;
  if (!m || unit === undefined) throw new Error(`invalid size "${text}" (examples: 4096, 64MiB, 1GiB)`);
  const n = Math.floor(Number(m[1]) * unit);
  if (!Number.isSafeInteger(n)) throw new Error(`size "${text}" is too large`);
  return n;
}
