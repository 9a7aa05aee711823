/**
 * bench/kv-routing's round-robin balancer as a process of its own (its CPU share shows apart
 * from the servers'): `node bench/fleet-scale/balance.ts URL...`; prints its URL, runs until
 * SIGTERM.
 */
import { startBalancer } from "../kv-routing/balancer.ts";

const lb = await startBalancer(process.argv.slice(2));
process.stdout.write(`${lb.url}\n`);
process.once("SIGTERM", () => {
  void lb.close().then(() => process.exit(0));
});
