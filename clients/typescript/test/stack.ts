// A real tether stack for the tests: `bin/tether-demo -up -auth` (PostgreSQL,
// executor, runnergw, backup-verifier, the fake codex provider; offline) on
// free ports, with its development tokens — or, with TETHER_TEST_EXECUTOR_ADDR
// and TETHER_TEST_CREDENTIALS set, a stack someone else started.
import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";

export interface Stack {
  /** The executor's gRPC address. */
  executor: string;
  /** The executor's HTTP base URL (Connect, SPEC U3), when it serves one. */
  connectUrl?: string;
  /** A development token: acme-writer, acme-reader, globex-writer, globex-reader, operator. */
  token(principal: string): string;
  stop(): Promise<void>;
}

const here = path.dirname(fileURLToPath(import.meta.url));
/** The repository's bin/ (TETHER_BIN overrides). */
const binDir = process.env.TETHER_BIN ?? path.resolve(here, "../../../../bin");

export async function startStack(): Promise<Stack> {
  if (process.env.TETHER_TEST_EXECUTOR_ADDR) {
    const creds = process.env.TETHER_TEST_CREDENTIALS ?? "";
    return {
      executor: process.env.TETHER_TEST_EXECUTOR_ADDR,
      connectUrl: process.env.TETHER_TEST_CONNECT_URL,
      token: (p) => readFileSync(path.join(creds, `${p}.token`), "utf8").trim(),
      stop: async () => {},
    };
  }
  let last: Error | undefined;
  for (let attempt = 0; attempt < 5; attempt++) {
    // tether-demo -up takes base+0..2, base+11 and base+2000..2002; it
    // refuses to start when one of them is taken: then try another base.
    const base = 20000 + Math.floor(Math.random() * 20000);
    try {
      return await startDemo(base);
    } catch (e) {
      last = e as Error;
      if (!/already in use|taken/i.test(String(e))) {
        throw e;
      }
    }
  }
  throw last;
}

function startDemo(base: number): Promise<Stack> {
  const child: ChildProcess = spawn(path.join(binDir, "tether-demo"), ["-up", "-auth", "-base-port", String(base)], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => fail(new Error(`tether-demo did not come up in 120 s:\n${out}`)), 120_000);
    const fail = (e: Error) => {
      clearTimeout(timer);
      child.kill("SIGTERM");
      reject(e);
    };
    const onData = (b: Buffer) => {
      out += b.toString();
      const addr = /demo: executor (\S+),/.exec(out)?.[1];
      const creds = /Development tokens \(24h\) in (\S+?):?\n/.exec(out)?.[1];
      if (addr && creds) {
        clearTimeout(timer);
        child.stdout?.off("data", onData);
        child.stdout?.resume();
        child.stderr?.resume();
        resolve({
          executor: addr,
          // Printed before the tokens by a tether-demo whose executor
          // serves the API over HTTP.
          connectUrl: /API over HTTP .*? on (http:\/\/[^\s,]+)/.exec(out)?.[1],
          token: (p) => readFileSync(path.join(creds, `${p}.token`), "utf8").trim(),
          stop: () =>
            new Promise<void>((done) => {
              child.once("exit", () => done());
              child.kill("SIGTERM");
            }),
        });
      }
    };
    child.stdout?.on("data", onData);
    child.stderr?.on("data", (b: Buffer) => (out += b.toString()));
    child.once("exit", (code) => fail(new Error(`tether-demo exited (${code}) during start:\n${out}`)));
  });
}

/** A TCP proxy in front of an address whose connections a test can cut. */
export interface Proxy {
  address: string;
  /** Destroys every open connection (new ones are accepted). */
  drop(): void;
  close(): Promise<void>;
}

export function startProxy(target: string): Promise<Proxy> {
  const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
  const open = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(port, host);
    for (const s of [client, upstream]) {
      open.add(s);
      s.on("close", () => open.delete(s));
      s.on("error", () => {});
    }
    client.pipe(upstream);
    upstream.pipe(client);
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
  });
  return new Promise((resolve) => {
    server.listen(0, "127.0.0.1", () => {
      const a = server.address() as net.AddressInfo;
      resolve({
        address: `127.0.0.1:${a.port}`,
        drop: () => {
          for (const s of open) {
            s.destroy();
          }
        },
        close: () =>
          new Promise<void>((done) => {
            for (const s of open) {
              s.destroy();
            }
            server.close(() => done());
          }),
      });
    });
  });
}
