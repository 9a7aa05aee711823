/**
 * libzmq's context allows ZMQ_MAX_SOCKETS sockets, 1023 by default, and sizes its slot table
 * once, when its first socket is made (zeromq/libzmq src/ctx.cpp ctx_t::start / create_socket
 * @ 00e514e2c9b8ae0373a2b9d0e594310efd152fe5: past the table, zmq_socket fails with EMFILE,
 * "Too many open file descriptors", whatever the process's fd limit). zeromq.js shares one
 * default context per process. A server following N workers' KV events holds three per worker
 * (its SUB and the two PAIRs of the SUB's monitor) and a DEALER per replay in flight, so the
 * default stopped it at 255 workers (the sim fleet raises its own limit: fleet.ts). The limit
 * is raised to libzmq's own ceiling on import, before any socket exists; the process's
 * open-file limit is then what bounds the sockets.
 */
import { context } from "zeromq";

export function raiseZmqSocketLimit(): void {
  try {
    if (context.maxSockets < context.maxSocketsLimit) context.maxSockets = context.maxSocketsLimit;
  } catch {
    // A context that refuses the option keeps its default.
  }
}

raiseZmqSocketLimit();
