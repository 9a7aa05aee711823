/**
 * The worker-side NATS agent as its own process for the benchmark (as `infera engine` runs it):
 * `node bench/nats/agent-proc.ts <natsUrl> <engineUrl> <model> <workerId>`.
 * Prints "ready" once subscribed.
 */
import { startRequestAgent } from "../../src/transport/nats/agent.ts";
import { connectNats } from "../../src/transport/nats/connection.ts";

const [natsUrl, engineUrl, model, workerId] = process.argv.slice(2);
if (!natsUrl || !engineUrl || !model || !workerId) {
  process.stderr.write("usage: agent-proc.ts <natsUrl> <engineUrl> <model> <workerId>\n");
  process.exit(2);
}
const nc = await connectNats({ url: natsUrl, name: `agent-${workerId}` });
const agent = await startRequestAgent({ nc, engineUrl, model, workerId });
process.stdout.write("ready\n");
const stop = async () => {
  await agent.close();
  await nc.close();
  process.exit(0);
};
process.on("SIGTERM", () => void stop());
process.on("SIGINT", () => void stop());
