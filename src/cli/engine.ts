import type { Command } from "commander";

// Placeholder registration: the owning issue replaces the action with the real command.
export function registerEngine(program: Command): void {
  program
    .command("engine")
    .description("(in progress)")
    .allowUnknownOption(true)
    .action(() => {
      throw new Error("infera engine is not built yet");
    });
}
