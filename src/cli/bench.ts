import type { Command } from "commander";

// Placeholder registration: the owning issue replaces the action with the real command.
export function registerBench(program: Command): void {
  program
    .command("bench")
    .description("(in progress)")
    .allowUnknownOption(true)
    .action(() => {
      throw new Error("infera bench is not built yet");
    });
}
