/** Types shared by the sim's command-line modules (args.ts, personalities/). */
import type { EngineKind } from "./engine-flags.ts";

/** A command line the engine's argparse would refuse: exit status 2, argparse's message. */
export class ArgParseError extends Error {
  readonly prog: string;
  constructor(message: string, prog: string) {
    super(message);
    this.prog = prog;
    this.name = "ArgParseError";
  }
  /** argparse's two lines: usage, then `prog: error: message`. */
  format(): string {
    return `usage: ${this.prog} [-h] [options]\n${this.prog}: error: ${this.message}\n`;
  }
}

export interface RawArgs {
  engine: EngineKind;
  prog: string;
  values: Map<string, string>;
  multi: Map<string, string[]>;
  bools: Set<string>;
  positionals: string[];
  ignored: string[];
  help: boolean;
}
