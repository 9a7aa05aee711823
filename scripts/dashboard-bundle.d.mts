import type { BuildOptions } from "esbuild";

export const DASHBOARD_SRC: string;
export const DASHBOARD_DIST: string;
export function dashboardBuildOptions(): BuildOptions & { outdir: string };
export function dashboardSourcesMtime(): number;
