/**
 * Histograms observed on per-token or per-request hot paths: a bucket scan and two adds, no
 * label hashing or object per call (prom-client's `observe` costs ≈ 0.4 µs even on a cached
 * label child; a 500-token stream observes 500 times). Rendered in Prometheus text by hand and
 * appended to the registry's output, in the same exposition format.
 */
export class FastHistogram {
  private readonly counts: Float64Array;
  private sum = 0;
  private count = 0;

  constructor(private readonly buckets: readonly number[]) {
    this.counts = new Float64Array(buckets.length);
  }

  observe(v: number): void {
    const b = this.buckets;
    let i = 0;
    while (i < b.length && v > b[i]) i++;
    if (i < b.length) this.counts[i]++;
    this.sum += v;
    this.count++;
  }

  /** The sample lines, `labels` being the rendered label pairs (`a="x",b="y"`, or empty). */
  lines(name: string, labels: string): string {
    const sep = labels === "" ? "" : ",";
    let out = "";
    let cum = 0;
    for (let i = 0; i < this.buckets.length; i++) {
      cum += this.counts[i];
      out += `${name}_bucket{${labels}${sep}le="${this.buckets[i]}"} ${cum}\n`;
    }
    out += `${name}_bucket{${labels}${sep}le="+Inf"} ${this.count}\n`;
    const braces = labels === "" ? "" : `{${labels}}`;
    out += `${name}_sum${braces} ${this.sum}\n${name}_count${braces} ${this.count}\n`;
    return out;
  }
}

/** Prometheus label-value escaping: backslash, double quote and newline. */
function escapeLabel(v: string): string {
  return v.replace(/[\\"\n]/g, (c) => (c === "\n" ? "\\n" : `\\${c}`));
}

/** One metric name with a child FastHistogram per label-value combination. */
export class FastHistogramFamily {
  private readonly children = new Map<string, { h: FastHistogram; labels: string }>();

  constructor(
    readonly name: string,
    private readonly help: string,
    private readonly buckets: readonly number[],
    private readonly labelNames: readonly string[],
  ) {}

  /** The child for these label values (in `labelNames` order), made on first use; cache it on hot paths. */
  child(...values: string[]): FastHistogram {
    const key = values.join("\0");
    let c = this.children.get(key);
    if (!c) {
      const labels = this.labelNames.map((n, i) => `${n}="${escapeLabel(values[i] ?? "")}"`).join(",");
      c = { h: new FastHistogram(this.buckets), labels };
      this.children.set(key, c);
    }
    return c.h;
  }

  text(): string {
    let out = `# HELP ${this.name} ${this.help}\n# TYPE ${this.name} histogram\n`;
    for (const c of this.children.values()) out += c.h.lines(this.name, c.labels);
    return out;
  }
}
