// Types of dist-stamp.mjs for the TypeScript callers (bench/router-overhead).
export declare const ROOT: string;
export declare const DIST: string;
export declare const STAMP: string;
export declare function sourceFingerprint(): string;
export declare function chooseEntry(): "dist" | "src";
