import { Command } from "commander";
import { registerBench } from "./bench.ts";
import { registerDeploy } from "./deploy.ts";
import { registerEngine } from "./engine.ts";
import { registerKvd } from "./kvd.ts";
import { registerOperator } from "./operator.ts";
import { registerServer } from "./server.ts";
import { registerUp } from "./up.ts";

/** Builds the `infera` command tree. Each subcommand lives in its own file and loads its heavy modules lazily. */
export function buildProgram(): Command {
  const program = new Command();
  program
    .name("infera")
    .description(
      "Inference orchestration for LLM serving clusters: OpenAI gateway, KV-aware and PD routing, kvd",
    )
    .version("0.1.0");
  registerServer(program);
  registerUp(program);
  registerEngine(program);
  registerKvd(program);
  registerBench(program);
  registerDeploy(program);
  registerOperator(program);
  return program;
}

export async function main(argv: string[]): Promise<void> {
  await buildProgram().parseAsync(argv);
}
