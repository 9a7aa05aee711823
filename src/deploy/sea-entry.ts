/**
 * Entry of the single-executable `infera` (deploy/build-sea.mjs): the engine images have no
 * Node, so the launcher ships as one file with Node inside. Same program as bin/infera.js.
 */
import { main } from "../cli/main.ts";

main(process.argv).catch((err: unknown) => {
  process.stderr.write(`infera: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});
