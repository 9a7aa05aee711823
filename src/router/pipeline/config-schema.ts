/**
 * The scheduling part of the server config: per-step profiles (`mixed`, `prefill`, `decode`),
 * each a list of filters, weighted scorers and a picker. The server's config schema embeds this
 * one, so a bad profile is refused with the key and the layer that gave it.
 *
 * Placeholder until the pipeline lands: any mapping passes here.
 */
import { z } from "zod";

export const profilesConfigSchema = z.record(z.string(), z.unknown());

export type ProfilesConfig = z.infer<typeof profilesConfigSchema>;
