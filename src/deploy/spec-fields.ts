/**
 * Field shapes of the cluster spec that keep hostile values out of manifests: names,
 * namespaces, images, label keys and values, host paths and free text are refused (with the key
 * path, by zod) when they hold newlines, shell or YAML metacharacters, or a non-canonical path.
 */
import { z } from "zod";

/** A namespace (DNS-1123 label, up to 63 characters). */
export const namespaceName = z
  .string()
  .min(1)
  .max(63)
  .regex(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, "must be a DNS-1123 label (lowercase letters, digits, '-')");

/**
 * Free text that reaches a command line or an annotation (model ids, served names, engine
 * arguments): no control characters, so no newline can split a YAML scalar, a log line or an
 * argument. `$(` is escaped where it reaches command/args (render/context.ts kubeLiteral).
 */
export const safeText = z
  .string()
  .min(1)
  .regex(/^[^\u0000-\u001f\u007f]*$/, "must not contain newlines or other control characters");

/**
 * A container image reference: [registry[:port]/]path[:tag][@sha256:digest], the distribution
 * reference grammar's characters only (no spaces, quotes, `$`, `;`, newlines).
 */
export const imageRef = z
  .string()
  .min(1)
  .max(512)
  .regex(
    /^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?\/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:\/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$/,
    "must be an image reference such as registry.example/org/name:tag or …@sha256:<64 hex>",
  );

/**
 * A host path: absolute and canonical (no `.`/`..` segments, no `//`, no trailing `/`), not `/`,
 * and only `[A-Za-z0-9._-]` in its segments. Which host paths are allowed at all is the
 * operator's policy (policy.ts); this is the shape every renderer input must have.
 */
export const hostPath = z
  .string()
  .max(1024)
  .refine((p) => p !== "/", "must not be / (the host's root)")
  .refine(
    (p) => p.split("/").every((seg) => seg !== "." && seg !== ".."),
    "must not contain . or .. segments",
  )
  .refine(
    (p) => p === "/" || /^(\/[A-Za-z0-9._-]+)+$/.test(p),
    "must be an absolute canonical path (no //, no trailing /, only letters, digits, '.', '_', '-')",
  );

/** A label key (optional DNS-subdomain prefix + name) and value, as the API validates them. */
export const labelKey = z
  .string()
  .max(316)
  .regex(
    /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/,
    "must be a label key ([prefix/]name of letters, digits, '-', '_', '.')",
  );
export const labelValue = z
  .string()
  .max(63)
  .regex(
    /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/,
    "must be a label value (letters, digits, '-', '_', '.')",
  );
