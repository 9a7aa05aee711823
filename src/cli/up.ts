import type { Command } from "commander";

// Placeholder registration: the owning issue replaces the action with the real command.
export function registerUp(program: Command): void {
  program
    .command("up")
    .description("(in progress)")
    .allowUnknownOption(true)
    .action(() => {
      throw new Error("infera up is not built yet");
    });
}
