// Typed errors (SPEC U2): every tether error carries a stable reason as a
// google.rpc.ErrorInfo detail (domain "tether") beside its status code, and
// the standard details of AIP-193 where they apply: google.rpc.RetryInfo
// when sending the same request again can succeed, google.rpc.BadRequest
// naming the refused fields of invalid input. TetherError (a ConnectError)
// exposes them; callers switch on `reason` (a value of Reason), never on
// the message.
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { BadRequestSchema, ErrorInfoSchema, RetryInfoSchema } from "./gen/google/rpc/error_details_pb.js";
import type { Reason } from "./reasons.js";

/** The ErrorInfo domain of every tether error. */
export const DOMAIN = "tether";

/** One refused request field (google.rpc.BadRequest.FieldViolation). */
export interface FieldViolation {
  /** Dotted proto field names, e.g. "input.task.prompt". */
  field: string;
  description: string;
  /** The protovalidate rule id or tether's code. */
  reason: string;
}

/**
 * A failed call of tether's API, decoded. It is a ConnectError (its name
 * stays "ConnectError", so connect's own checks and `instanceof
 * ConnectError` hold).
 */
export class TetherError extends ConnectError {
  // ConnectError's instanceof recognises plain ConnectErrors only (also
  // across copies of the package); a TetherError is recognised by its
  // prototype chain.
  static override [Symbol.hasInstance](v: unknown): boolean {
    return typeof v === "object" && v !== null && TetherError.prototype.isPrototypeOf(v);
  }

  /**
   * The stable reason (ErrorInfo.reason, domain "tether"); "" when the
   * failure did not come from tether (e.g. the connection dropped). A few
   * reasons are qualified ("reason:detail"): see `baseReason`.
   */
  readonly reason: Reason | "";
  /** ErrorInfo metadata: facts about the failure (ids, counts, a field). */
  readonly info: Readonly<Record<string, string>>;
  /**
   * Set when a retry of the same request can succeed (RetryInfo): how long
   * to wait before the first retry, in milliseconds.
   */
  readonly retryDelayMs: number | undefined;
  /** The refused fields of invalid input (BadRequest). */
  readonly fieldViolations: readonly FieldViolation[];
  /** The message without the reason prefix. */
  readonly detail: string;

  constructor(from: ConnectError) {
    super(from.rawMessage, from.code, from.metadata, undefined, from);
    this.details = from.details;
    this.isWireError = from.isWireError;
    let reason = "";
    let info: Record<string, string> = {};
    for (const d of from.findDetails(ErrorInfoSchema)) {
      if (d.domain === DOMAIN) {
        reason = d.reason;
        info = { ...d.metadata };
        break;
      }
    }
    this.reason = reason as Reason | "";
    this.info = info;
    const retry = from.findDetails(RetryInfoSchema)[0];
    this.retryDelayMs =
      retry === undefined
        ? undefined
        : Number(retry.retryDelay?.seconds ?? 0n) * 1000 + Math.round((retry.retryDelay?.nanos ?? 0) / 1e6);
    this.fieldViolations = from
      .findDetails(BadRequestSchema)
      .flatMap((b) => b.fieldViolations.map((v) => ({ field: v.field, description: v.description, reason: v.reason })));
    this.detail = reason !== "" && from.rawMessage.startsWith(reason + ": ") ? from.rawMessage.slice(reason.length + 2) : from.rawMessage;
  }

  /** The reason without its qualifier ("a:b" → "a"). */
  get baseReason(): Reason | "" {
    const i = this.reason.indexOf(":");
    return (i < 0 ? this.reason : this.reason.slice(0, i)) as Reason | "";
  }

  /** True when RetryInfo says the same request may be sent again. */
  get retryable(): boolean {
    return this.retryDelayMs !== undefined;
  }
}

/**
 * toTetherError converts anything a call threw into a TetherError (an
 * error that is not a ConnectError, e.g. an abort, gets ConnectError.from's
 * code and no reason).
 */
export function toTetherError(err: unknown): TetherError {
  if (err instanceof TetherError) {
    return err;
  }
  return new TetherError(ConnectError.from(err));
}

/**
 * isTetherError says whether err is a TetherError with one of the given
 * reasons (with any tether reason when none is given), narrowing it.
 */
export function isTetherError(err: unknown, ...reasons: Reason[]): err is TetherError {
  if (!(err instanceof TetherError)) {
    return false;
  }
  return reasons.length === 0 ? err.reason !== "" : reasons.includes(err.baseReason as Reason);
}

/**
 * tetherErrors is the interceptor that turns every failed call's error into
 * a TetherError: a unary call's, and a server stream's, mid-stream too.
 */
export const tetherErrors: Interceptor = (next) => async (req) => {
  let res;
  try {
    res = await next(req);
  } catch (e) {
    throw toTetherError(e);
  }
  if (!res.stream) {
    return res;
  }
  const inner = res.message;
  return {
    ...res,
    message: (async function* () {
      try {
        yield* inner;
      } catch (e) {
        throw toTetherError(e);
      }
    })(),
  };
};

export { Code };
