/**
 * A small seeded PRNG (mulberry32) and the samplers the workloads need. Math.random is never
 * used: the same seed must give byte-identical workloads and arrival schedules on every machine.
 */
import { Mulberry32 } from "../util/mulberry32.ts";

export class Prng extends Mulberry32 {
  constructor(seed: number) {
    // Mix the seed once so that nearby seeds (1, 2, 3) give unrelated streams.
    super(hash32(seed >>> 0 || 0x9e3779b9));
  }

  /** Integer in [lo, hi], both inclusive. */
  int(lo: number, hi: number): number {
    if (hi <= lo) return lo;
    return lo + Math.floor(this.next() * (hi - lo + 1));
  }

  pick<T>(items: readonly T[]): T {
    return items[Math.floor(this.next() * items.length)];
  }

  /** Exponential with the given rate (events per unit); the gaps of a Poisson process. */
  exponential(rate: number): number {
    return -Math.log(1 - this.next()) / rate;
  }

  /** An independent stream for a sub-purpose, so adding draws to one part does not shift another. */
  fork(label: string): Prng {
    let h = this.state;
    for (let i = 0; i < label.length; i++) h = hash32(h ^ label.charCodeAt(i));
    return new Prng(h);
  }
}

function hash32(x: number): number {
  x = Math.imul(x ^ (x >>> 16), 0x85ebca6b);
  x = Math.imul(x ^ (x >>> 13), 0xc2b2ae35);
  return (x ^ (x >>> 16)) >>> 0;
}

/**
 * Common English words, each a single token (with its leading space) in the o200k and cl100k
 * vocabularies, so that `n` words make a prompt of about `n` tokens without running a tokenizer.
 */
const WORDS = (
  "the of and to in is that for it as was with be by on not he this are or his from at which but have an " +
  "they you were her she there been one all we their has would when if so no what up out who them some " +
  "more time will into only could new its other then than first any like now over such our man me even " +
  "most made after also did many before must through years where much your way well down should because " +
  "each just those people how too little state good very make world still own see men work long get here " +
  "between both life being under never day same another know while last might us great old year off come " +
  "since against go came right used take three states himself few house use during without again place " +
  "around however home small found thought went say part once general high upon school every does got " +
  "united left number course war until always away something fact though water less public put think " +
  "almost hand enough far took head yet government system better set told nothing night end why called " +
  "didn eyes find going look asked later knew point next city give group young toward days business"
).split(" ");

/** `n` words of seeded filler text (about `n` tokens). */
export function words(rng: Prng, n: number): string {
  const out: string[] = new Array(n);
  for (let i = 0; i < n; i++) out[i] = rng.pick(WORDS);
  return out.join(" ");
}
