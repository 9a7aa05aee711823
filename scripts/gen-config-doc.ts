/**
 * Rewrites the generated part of docs/configuration.md (the INFERA_* table) from
 * src/config/env-table.ts: `node scripts/gen-config-doc.ts`.
 * test/server/config-schema.test.ts fails while the doc is stale.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { renderConfigDoc } from "../src/config/doc.ts";

const path = fileURLToPath(new URL("../docs/configuration.md", import.meta.url));
writeFileSync(path, renderConfigDoc(readFileSync(path, "utf8")));
