// Watching a run, and submit-and-watch (SPEC U2). WatchRun replays a run's
// events after a cursor (after_seq) and then streams live ones until the
// run's terminal event; every event has its run-local seq. A stream that
// drops (a connection reset, an executor replica draining, a watcher cut off
// for being slow) is resumed from the last seq seen, so the caller sees
// every event once, in order, and the final result.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import {
  SubmitRunRequestSchema,
  type RunResult,
  type SubmitRunResponse,
  type WatchRunResponse,
} from "./gen/tether/executor/v1/executor_pb.js";
import type { TetherClient } from "./client.js";
import { toTetherError, type TetherError } from "./errors.js";

/** Options of watchRun. */
export interface WatchOptions {
  /** The run's company, when the caller can read more than one company's run of this id. */
  companyId?: string;
  /** Start after this seq (0n: from the first event). */
  afterSeq?: bigint;
  /** Stops the watch (the generator then throws the abort). */
  signal?: AbortSignal;
  /** How many drops in a row are resumed before the error is thrown (default 10). */
  maxResumes?: number;
  /** The first resume's delay in ms (default 100), doubled per drop up to 2 s, ±20 % jitter. */
  resumeDelayMs?: number;
  /** Told of every resume: the error that dropped the stream and the seq it resumes after. */
  onResume?: (err: TetherError, afterSeq: bigint) => void;
}

/** resumable says whether a watch that failed with err may be resumed. */
export function resumable(err: TetherError): boolean {
  switch (err.baseReason) {
    case "executor_draining": // a replica going away hands its watchers over
    case "watch_consumer_too_slow": // cut off behind: resume from the cursor
      return true;
    case "":
      // No tether reason: the stream broke below the API (connection
      // reset, HTTP/2 stream reset or cancel, a proxy going away). The
      // caller's own abort is told apart by its signal.
      return [Code.Unavailable, Code.Internal, Code.Unknown, Code.Aborted, Code.Canceled, Code.DeadlineExceeded].includes(err.code);
  }
  return err.retryable && err.code !== Code.ResourceExhausted;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * watchRun yields a run's events after opts.afterSeq, each once and in
 * order, resuming after a dropped stream from the last seq it yielded; it
 * returns after the run's terminal event (whose message carries the result).
 */
export async function* watchRun(client: TetherClient, runId: string, opts: WatchOptions = {}): AsyncGenerator<WatchRunResponse> {
  let cursor = opts.afterSeq ?? 0n;
  const max = opts.maxResumes ?? 10;
  let delay = opts.resumeDelayMs ?? 100;
  for (let drops = 0; ; ) {
    try {
      const stream = client.executor.watchRun({ runId, afterSeq: cursor, companyId: opts.companyId ?? "" }, { signal: opts.signal });
      for await (const m of stream) {
        if (m.seq <= cursor) {
          continue; // already yielded before the drop
        }
        cursor = m.seq;
        drops = 0;
        delay = opts.resumeDelayMs ?? 100;
        yield m;
      }
      return;
    } catch (e) {
      const err = toTetherError(e);
      if (opts.signal?.aborted || !resumable(err) || drops >= max) {
        throw err;
      }
      drops++;
      opts.onResume?.(err, cursor);
      await sleep(delay * (0.8 + 0.4 * Math.random()), opts.signal);
      delay = Math.min(delay * 2, 2000);
    }
  }
}

/** What submitAndWatch returns. */
export interface SubmitAndWatchResult {
  /** The SubmitRun answer (created false: the run existed with this input). */
  submitted: SubmitRunResponse;
  /** The run's result, from its terminal event. */
  result: RunResult | undefined;
  /** The last event's seq. */
  lastSeq: bigint;
}

/** Options of submitAndWatch. */
export interface SubmitAndWatchOptions extends Omit<WatchOptions, "companyId"> {
  /** Called with every event, in order, once. */
  onEvent?: (m: WatchRunResponse) => void;
  /**
   * How many times a SubmitRun that failed retryably (RetryInfo, or the
   * connection failing) is sent again (default 3): SubmitRun is idempotent
   * by run id, so a retry never makes a second run.
   */
  submitRetries?: number;
}

/**
 * submitAndWatch submits a run (retrying a retryable failure: the same
 * run id is idempotent) and watches it to its end, resuming dropped
 * streams; the run's company is the input's.
 */
export async function submitAndWatch(
  client: TetherClient,
  request: MessageInitShape<typeof SubmitRunRequestSchema>,
  opts: SubmitAndWatchOptions = {},
): Promise<SubmitAndWatchResult> {
  const req = create(SubmitRunRequestSchema, request);
  let submitted: SubmitRunResponse | undefined;
  for (let attempt = 0; submitted === undefined; attempt++) {
    try {
      submitted = await client.executor.submitRun(req, { signal: opts.signal });
    } catch (e) {
      const err = toTetherError(e);
      const transient = err.retryable || (err.reason === "" && err.code === Code.Unavailable);
      if (opts.signal?.aborted || !transient || attempt >= (opts.submitRetries ?? 3)) {
        throw err;
      }
      await sleep(err.retryDelayMs ?? 200, opts.signal);
    }
  }
  let result: RunResult | undefined;
  let lastSeq = opts.afterSeq ?? 0n;
  for await (const m of watchRun(client, req.runId, { ...opts, companyId: req.input?.binding?.companyId })) {
    lastSeq = m.seq;
    if (m.result) {
      result = m.result;
    }
    opts.onEvent?.(m);
  }
  return { submitted, result, lastSeq };
}
