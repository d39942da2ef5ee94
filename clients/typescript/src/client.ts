// The client factory (SPEC U2): one transport to an executor — gRPC over
// HTTP/2 against its gRPC port (plaintext on loopback, TLS or mutual TLS
// elsewhere), or the Connect protocol against an HTTP base URL (the
// executor's browser port, SPEC U3) — with the caller's credentials, and
// typed clients of ExecutorService and GatewayRegistry whose failures are
// TetherErrors.
import { readFileSync } from "node:fs";
import { createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { ExecutorService } from "./gen/tether/executor/v1/executor_pb.js";
import { GatewayRegistry } from "./gen/tether/executor/v1/fleet_pb.js";
import { tetherErrors } from "./errors.js";

/** TLS material (PEM contents) for the executor's gRPC port. */
export interface TlsOptions {
  /** CA bundle that signed the executor's certificate (default: the system's). */
  ca?: string | Buffer;
  /** A client certificate and its key: mutual TLS (SPEC T1 identities). */
  cert?: string | Buffer;
  key?: string | Buffer;
  /** The name the executor's certificate must carry, when not the address's host. */
  serverName?: string;
}

/** readTlsFiles reads PEM files (the ones tetherctl takes as -ca, -cert, -key). */
export function readTlsFiles(files: { ca?: string; cert?: string; key?: string; serverName?: string }): TlsOptions {
  return {
    ca: files.ca ? readFileSync(files.ca) : undefined,
    cert: files.cert ? readFileSync(files.cert) : undefined,
    key: files.key ? readFileSync(files.key) : undefined,
    serverName: files.serverName,
  };
}

/** How to reach an executor, and as whom. */
export interface TetherClientOptions {
  /**
   * The executor's gRPC address, "host:port" (e.g. "127.0.0.1:7400"), or
   * a URL: http://host:port (plaintext HTTP/2) or https://host:port. A
   * host:port is https when tls is given, plaintext otherwise.
   */
  address?: string;
  /**
   * Instead of address: an HTTP base URL serving the Connect protocol
   * (the executor's HTTP port, SPEC U3), e.g. "http://127.0.0.1:7480".
   */
  connectBaseUrl?: string;
  /**
   * A bearer token (a JWT, SPEC T1) sent as "authorization: Bearer …" with
   * every call; a function is asked before each call (token refresh).
   */
  token?: string | (() => string | Promise<string>);
  /** TLS, or mutual TLS with cert and key, for address. */
  tls?: TlsOptions;
  /** More interceptors (run before the credentials are added). */
  interceptors?: Interceptor[];
  /** A transport of your own instead of address / connectBaseUrl. */
  transport?: Transport;
}

/** Typed clients of one executor (fleet). */
export interface TetherClient {
  /** ExecutorService: runs, steering, sessions, interactions, secrets. */
  executor: Client<typeof ExecutorService>;
  /** GatewayRegistry: the runner gateways (ListGateways, DrainGateway). */
  gateways: Client<typeof GatewayRegistry>;
  transport: Transport;
}

/** bearer adds the token to every call. */
export function bearer(token: string | (() => string | Promise<string>)): Interceptor {
  return (next) => async (req) => {
    const t = typeof token === "function" ? await token() : token;
    req.header.set("authorization", `Bearer ${t.trim()}`);
    return next(req);
  };
}

/** createTetherTransport builds the transport options describe. */
export function createTetherTransport(opts: TetherClientOptions): Transport {
  if (opts.transport) {
    return opts.transport;
  }
  // tetherErrors runs last on the way back, so every failure the caller
  // sees (also one raised by a caller's interceptor) is a TetherError.
  const interceptors: Interceptor[] = [tetherErrors, ...(opts.interceptors ?? [])];
  if (opts.token !== undefined) {
    interceptors.push(bearer(opts.token));
  }
  if (opts.connectBaseUrl) {
    return createConnectTransport({ baseUrl: opts.connectBaseUrl, httpVersion: "1.1", interceptors });
  }
  if (!opts.address) {
    throw new Error("tether client: address or connectBaseUrl is required");
  }
  let baseUrl = opts.address;
  if (!/^https?:\/\//.test(baseUrl)) {
    baseUrl = (opts.tls ? "https://" : "http://") + baseUrl;
  }
  const tls = opts.tls;
  return createGrpcTransport({
    baseUrl,
    interceptors,
    nodeOptions: tls ? { ca: tls.ca, cert: tls.cert, key: tls.key, servername: tls.serverName } : undefined,
  });
}

/** createTetherClient returns typed clients of the executor options name. */
export function createTetherClient(opts: TetherClientOptions): TetherClient {
  const transport = createTetherTransport(opts);
  return {
    executor: createClient(ExecutorService, transport),
    gateways: createClient(GatewayRegistry, transport),
    transport,
  };
}
