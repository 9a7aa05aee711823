/**
 * Generated sections inside hand-written docs: the text between a begin and an end marker is
 * replaced, the prose around it left alone. Used by the config doc (src/config/doc.ts) and the
 * plugin list (src/router/pipeline/doc.ts), whose generators and staleness checks compare the
 * file with this function's output.
 */

/**
 * `doc` with the text between `begin` and `end` replaced by `body(indent)`, where `indent` is
 * what precedes `begin` on its line (so generated lines can stay inside a list item); the end
 * marker gets the same indent. Throws, naming `what`, when the markers are missing.
 */
export function replaceBetweenMarkers(
  doc: string,
  begin: string,
  end: string,
  body: (indent: string) => string,
  what: string,
): string {
  const a = doc.indexOf(begin);
  const b = doc.indexOf(end);
  if (a < 0 || b < a) throw new Error(`${what} markers not found`);
  const indent = doc.slice(doc.lastIndexOf("\n", a) + 1, a);
  return `${doc.slice(0, a + begin.length)}\n${body(indent)}\n${indent}${doc.slice(b)}`;
}
