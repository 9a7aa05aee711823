import type { Command } from "commander";

// Placeholder registration: the owning issue replaces the action with the real command.
export function registerServer(program: Command): void {
  program
    .command("server")
    .description("(in progress)")
    .allowUnknownOption(true)
    .action(() => {
      throw new Error("infera server is not built yet");
    });
}
