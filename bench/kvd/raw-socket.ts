/** Child of bench/kvd/run.ts: streams `count` buffers of `size` bytes into a Unix socket. */
import net from "node:net";
import { widenSendBuffer } from "../../src/kvd/socket-reader.ts";

const [path, sizeS, countS] = process.argv.slice(2);
const size = Number(sizeS);
const count = Number(countS);
const buf = Buffer.alloc(size, 0x5a);
const s = net.connect(path!, () => {
  // The same send buffer kvd's own sockets ask for, so the baseline is the same socket.
  widenSendBuffer(s);
  let i = 0;
  const pump = () => {
    while (i < count) {
      i++;
      if (!s.write(buf)) {
        s.once("drain", pump);
        return;
      }
    }
    s.end();
  };
  pump();
});
s.on("error", () => process.exit(1));
