/**
 * A Pod Security Standards checker, written from the Kubernetes document
 * https://kubernetes.io/docs/concepts/security/pod-security-standards/ (the "latest" policy
 * version, as of Kubernetes v1.32: the controls below are that page's Baseline and Restricted
 * tables; Windows-only and annotation-era controls left out as no pod here sets them).
 * `violations(pod, "restricted")` returns each failed control as `control: field`.
 */

// biome-ignore lint/suspicious/noExplicitAny: walks untyped manifests
type Obj = Record<string, any>;

export type Level = "baseline" | "restricted";

/** Baseline "Capabilities": the only ones that may be added. */
const BASELINE_CAPS = new Set([
  "AUDIT_WRITE",
  "CHOWN",
  "DAC_OVERRIDE",
  "FOWNER",
  "FSETID",
  "KILL",
  "MKNOD",
  "NET_BIND_SERVICE",
  "SETFCAP",
  "SETGID",
  "SETPCAP",
  "SETUID",
  "SYS_CHROOT",
]);
/** Baseline "Sysctls": the safe set. */
const SAFE_SYSCTLS = new Set([
  "kernel.shm_rmid_forced",
  "net.ipv4.ip_local_port_range",
  "net.ipv4.ip_unprivileged_port_start",
  "net.ipv4.tcp_syncookies",
  "net.ipv4.ping_group_range",
  "net.ipv4.ip_local_reserved_ports",
  "net.ipv4.tcp_keepalive_time",
  "net.ipv4.tcp_fin_timeout",
  "net.ipv4.tcp_keepalive_intvl",
  "net.ipv4.tcp_keepalive_probes",
]);
/** Restricted "Volume Types": the only kinds allowed. */
const RESTRICTED_VOLUMES = new Set([
  "configMap",
  "csi",
  "downwardAPI",
  "emptyDir",
  "ephemeral",
  "persistentVolumeClaim",
  "projected",
  "secret",
]);
const SELINUX_TYPES = new Set([
  "",
  "container_t",
  "container_init_t",
  "container_kvm_t",
  "container_engine_t",
]);

function baseline(pod: Obj): string[] {
  const out: string[] = [];
  const psc = pod.securityContext ?? {};
  const containers: Obj[] = [...(pod.initContainers ?? []), ...(pod.containers ?? [])];
  if (psc.windowsOptions?.hostProcess)
    out.push("HostProcess: spec.securityContext.windowsOptions.hostProcess");
  for (const f of ["hostNetwork", "hostPID", "hostIPC"]) if (pod[f]) out.push(`Host Namespaces: spec.${f}`);
  for (const v of pod.volumes ?? [])
    if (v.hostPath) out.push(`HostPath Volumes: volume ${v.name} (${v.hostPath.path})`);
  const seccompOk = (s: Obj | undefined) => s?.type !== "Unconfined";
  if (!seccompOk(psc.seccompProfile)) out.push("Seccomp: spec.securityContext.seccompProfile Unconfined");
  if (psc.appArmorProfile?.type === "Unconfined") out.push("AppArmor: spec.securityContext.appArmorProfile");
  const se = psc.seLinuxOptions;
  if (se && (se.user || se.role || !SELINUX_TYPES.has(se.type ?? "")))
    out.push("SELinux: spec.securityContext");
  for (const s of psc.sysctls ?? []) if (!SAFE_SYSCTLS.has(s.name)) out.push(`Sysctls: ${s.name}`);
  for (const c of containers) {
    const sc = c.securityContext ?? {};
    const at = `container ${c.name}`;
    if (sc.windowsOptions?.hostProcess) out.push(`HostProcess: ${at}`);
    if (sc.privileged) out.push(`Privileged Containers: ${at}`);
    for (const cap of sc.capabilities?.add ?? [])
      if (!BASELINE_CAPS.has(cap)) out.push(`Capabilities: ${at} adds ${cap}`);
    for (const p of c.ports ?? []) if (p.hostPort) out.push(`Host Ports: ${at} hostPort ${p.hostPort}`);
    if (sc.appArmorProfile?.type === "Unconfined") out.push(`AppArmor: ${at}`);
    const cse = sc.seLinuxOptions;
    if (cse && (cse.user || cse.role || !SELINUX_TYPES.has(cse.type ?? ""))) out.push(`SELinux: ${at}`);
    if (sc.procMount && sc.procMount !== "Default") out.push(`/proc Mount Type: ${at}`);
    if (!seccompOk(sc.seccompProfile)) out.push(`Seccomp: ${at} Unconfined`);
  }
  return out;
}

function restrictedOnly(pod: Obj): string[] {
  const out: string[] = [];
  const psc = pod.securityContext ?? {};
  const containers: Obj[] = [...(pod.initContainers ?? []), ...(pod.containers ?? [])];
  for (const v of pod.volumes ?? []) {
    const kind = Object.keys(v).find((k) => k !== "name");
    if (kind && !RESTRICTED_VOLUMES.has(kind)) out.push(`Volume Types: volume ${v.name} is ${kind}`);
  }
  if (psc.runAsUser === 0) out.push("Running as Non-root user: spec.securityContext.runAsUser 0");
  for (const c of containers) {
    const sc = c.securityContext ?? {};
    const at = `container ${c.name}`;
    if (sc.allowPrivilegeEscalation !== false) out.push(`Privilege Escalation: ${at}`);
    // Non-root: the container's own setting wins; unset falls back to the pod's, which must be true.
    const nonRoot = sc.runAsNonRoot ?? psc.runAsNonRoot;
    if (nonRoot !== true) out.push(`Running as Non-root: ${at}`);
    if (sc.runAsUser === 0) out.push(`Running as Non-root user: ${at} runAsUser 0`);
    const seccomp = sc.seccompProfile?.type ?? psc.seccompProfile?.type;
    if (seccomp !== "RuntimeDefault" && seccomp !== "Localhost")
      out.push(`Seccomp: ${at} (${seccomp ?? "unset"})`);
    const caps = sc.capabilities ?? {};
    if (!(caps.drop ?? []).includes("ALL")) out.push(`Capabilities: ${at} does not drop ALL`);
    for (const cap of caps.add ?? [])
      if (cap !== "NET_BIND_SERVICE")
        out.push(`Capabilities: ${at} adds ${cap} (restricted: NET_BIND_SERVICE only)`);
  }
  return out;
}

/** The controls a pod spec fails at this level (restricted includes baseline). */
export function violations(pod: Obj, level: Level): string[] {
  return level === "baseline" ? baseline(pod) : [...baseline(pod), ...restrictedOnly(pod)];
}

/** The most restrictive level the pod passes. */
export function podLevel(pod: Obj): Level | "privileged" {
  if (violations(pod, "restricted").length === 0) return "restricted";
  return violations(pod, "baseline").length === 0 ? "baseline" : "privileged";
}

/** Pod templates of the workloads in a rendered object list. */
export function podTemplates(objs: readonly Obj[]): { name: string; kind: string; pod: Obj; labels: Obj }[] {
  return objs
    .filter((o) => ["Deployment", "StatefulSet", "DaemonSet", "Job", "Pod"].includes(o.kind))
    .map((o) => ({
      name: o.metadata.name,
      kind: o.kind,
      pod: o.kind === "Pod" ? o.spec : o.spec.template.spec,
      labels: o.kind === "Pod" ? o.metadata.labels : o.spec.template.metadata.labels,
    }));
}
