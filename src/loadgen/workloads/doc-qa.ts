import { Prng, words } from "../prng.ts";
import type { BenchRequest } from "../types.ts";

export interface DocQaSpec {
  kind: "doc-qa";
  /** Number of long documents (K). Default 4. */
  documents?: number;
  /** Document length in tokens. Default 2000. */
  docLen?: number;
  /** Question length range in tokens. Default [16, 64]. */
  questionLen?: [number, number];
}

const SYSTEM = "You answer questions about the document the user gives. Quote it where you can.";

/**
 * Questions over K long documents: every request carries one whole document before its question,
 * so requests on the same document share a long prefix (the case prefix caching and KV-aware
 * routing are for). Documents are picked uniformly at random.
 */
export function docQaWorkload(spec: DocQaSpec, n: number, seed: number, maxTokens?: number): BenchRequest[] {
  const root = new Prng(seed);
  const docRng = root.fork("doc-qa/docs");
  const qRng = root.fork("doc-qa/questions");
  const k = Math.max(1, spec.documents ?? 4);
  const docLen = spec.docLen ?? 2000;
  const [qLo, qHi] = spec.questionLen ?? [16, 64];
  const docs: string[] = [];
  for (let d = 0; d < k; d++) docs.push(words(docRng, docLen));
  const out: BenchRequest[] = [];
  for (let i = 0; i < n; i++) {
    const d = qRng.int(0, k - 1);
    const question = `${words(qRng, qRng.int(qLo, qHi))}?`;
    out.push({
      index: i,
      group: `doc-${d}`,
      messages: [
        { role: "system", content: SYSTEM },
        { role: "user", content: `Document ${d}:\n${docs[d]}\n\nQuestion: ${question}` },
      ],
      maxTokens: maxTokens ?? qRng.int(32, 128),
    });
  }
  return out;
}
