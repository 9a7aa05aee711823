/**
 * Incremental parser for `text/event-stream` bodies: feed it byte chunks, get the `data` payload
 * of every complete event. Handles LF and CRLF line ends, multi-line data fields, comments
 * (`: keep-alive`) and events split across chunks at any byte.
 */
export class SseParser {
  private readonly decoder = new TextDecoder();
  private buffer = "";
  private dataLines: string[] = [];

  /** Returns the data payloads of the events completed by this chunk. */
  push(chunk: Uint8Array): string[] {
    this.buffer += this.decoder.decode(chunk, { stream: true });
    return this.drain();
  }

  /** Call at end of stream: returns an event left without its terminating blank line, if any. */
  end(): string[] {
    this.buffer += this.decoder.decode();
    const out = this.drain();
    if (this.buffer.length > 0) this.line(this.buffer, out);
    this.buffer = "";
    if (this.dataLines.length > 0) out.push(this.dataLines.join("\n"));
    this.dataLines = [];
    return out;
  }

  private drain(): string[] {
    const out: string[] = [];
    let nl = this.buffer.indexOf("\n");
    while (nl >= 0) {
      let line = this.buffer.slice(0, nl);
      if (line.endsWith("\r")) line = line.slice(0, -1);
      this.buffer = this.buffer.slice(nl + 1);
      this.line(line, out);
      nl = this.buffer.indexOf("\n");
    }
    return out;
  }

  private line(line: string, out: string[]): void {
    if (line === "") {
      if (this.dataLines.length > 0) out.push(this.dataLines.join("\n"));
      this.dataLines = [];
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    if (field !== "data") return;
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    this.dataLines.push(value);
  }
}
