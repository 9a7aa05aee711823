import type { Command } from "commander";

// Placeholder registration: the owning issue replaces the action with the real command.
export function registerKvd(program: Command): void {
  program
    .command("kvd")
    .description("(in progress)")
    .allowUnknownOption(true)
    .action(() => {
      throw new Error("infera kvd is not built yet");
    });
}
