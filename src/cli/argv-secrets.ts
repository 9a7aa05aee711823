/**
 * Secrets never on argv: every user of the host reads a process's command line (`ps`,
 * /proc/PID/cmdline), and shells keep it in their history. A secret-valued flag is refused when
 * its value came from the command line (commander's value source "cli"); the same value is taken
 * from its environment variable (or the config file), which only the process's user can read.
 * One hook per command, so each command lists its secrets and none repeats the check.
 */
import type { Command } from "commander";
import { urlHasPassword } from "../util/mask.ts";

export interface ArgvSecret {
  /** commander's attribute name of the option, e.g. "natsPassword" for --nats-password. */
  key: string;
  /** The environment variable that carries the same value. */
  env: string;
  /** Another place for it, e.g. "`nats.password` in the --config file". */
  alt?: string;
  /**
   * URL-valued (one, a list, or comma-separated): refused only when a URL carries a password
   * ("password"), or any userinfo ("userinfo": NATS reads a lone `nats://TOKEN@host` as a token).
   */
  url?: "password" | "userinfo";
}

/** --nats-url (a password in its userinfo), --nats-token, --nats-password; `config` adds the file keys. */
export function natsArgvSecrets(config: boolean): ArgvSecret[] {
  const file = (k: string) => (config ? `\`nats.${k}\` in the --config file` : undefined);
  return [
    { key: "natsUrl", env: "INFERA_NATS_URL", alt: file("url"), url: "userinfo" },
    { key: "natsToken", env: "INFERA_NATS_TOKEN", alt: file("token") },
    { key: "natsPassword", env: "INFERA_NATS_PASSWORD", alt: file("password") },
  ];
}

/** The first secret given on the command line, as a one-line message that never holds the value. */
export function argvSecretProblem(cmd: Command, secrets: readonly ArgvSecret[]): string | undefined {
  for (const s of secrets) {
    if (cmd.getOptionValueSource(s.key) !== "cli") continue;
    const value: unknown = cmd.getOptionValue(s.key);
    if (s.url && !urlsOf(value).some(s.url === "password" ? urlHasPassword : hasUserinfo)) continue;
    const flag = cmd.options.find((o) => o.attributeName() === s.key)?.long ?? s.key;
    const what = s.url ? "a URL with credentials" : "a secret";
    const where = s.alt ? `${s.env} or ${s.alt}` : s.env;
    return (
      `${flag}: ${what} on the command line, where any user of the host can read it ` +
      `(ps, /proc/PID/cmdline); set it in ${where} instead`
    );
  }
  return undefined;
}

/** Refuses (exit 2, one line on stderr) a command run with one of `secrets` on its command line. */
export function refuseArgvSecrets(cmd: Command, secrets: readonly ArgvSecret[]): Command {
  return cmd.hook("preAction", (_hooked, action) => {
    const problem = argvSecretProblem(action, secrets);
    if (problem === undefined) return;
    process.stderr.write(`infera ${action.name()}: ${problem}\n`);
    process.exit(2);
  });
}

function urlsOf(v: unknown): string[] {
  const list = Array.isArray(v) ? v : [v];
  return list.flatMap((x) => (typeof x === "string" ? x.split(",").map((s) => s.trim()) : []));
}

function hasUserinfo(url: string): boolean {
  return urlHasPassword(url) || /^[a-z][a-z0-9+.-]*:\/\/[^/@\s]+@/i.test(url);
}
