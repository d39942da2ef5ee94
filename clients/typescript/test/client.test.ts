// SPEC U2 against a real stack (bin/tether-demo -up -auth, offline): the
// test names start with U2 so that `go test -run U2` (which runs this
// suite, TestU2_TypeScriptClientAgainstARealStack) and `npm test` report
// the same cases.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { randomBytes } from "node:crypto";
import {
  Code,
  TetherError,
  createTetherClient,
  isTetherError,
  submitAndWatch,
  watchRun,
  type TetherClient,
  type WatchRunResponse,
} from "../src/index.js";
import { LifecycleMode } from "../src/gen/tether/prp/v1/execution_pb.js";
import { startProxy, startStack, type Stack } from "./stack.js";

let stack: Stack;

before(async () => {
  stack = await startStack();
});

after(async () => {
  await stack?.stop();
});

function id(prefix: string): string {
  return `${prefix}-${randomBytes(4).toString("hex")}`;
}

function input(company: string, session: string, prompt: string, labels?: Record<string, string>) {
  return {
    provider: { kind: "codex" },
    binding: { companyId: company, agentId: "agent-1" },
    task: { prompt },
    session: { normalizedSessionId: session, driverKind: "codex_app_server", lifecycle: { mode: LifecycleMode.WARM } },
    runner: labels ? { labels } : undefined,
  };
}

function client(principal?: string, address?: string): TetherClient {
  return createTetherClient({ address: address ?? stack.executor, token: principal ? stack.token(principal) : undefined });
}

/** Every seq from 1 to the last, once, in order. */
function assertContiguous(events: WatchRunResponse[]) {
  assert.ok(events.length > 0);
  events.forEach((m, i) => assert.equal(m.seq, BigInt(i + 1), `event ${i} has seq ${m.seq}`));
}

describe("U2 TypeScript client", () => {
  test("U2 submitAndWatch runs a turn to its result with a bearer token", async () => {
    const acme = client("acme-writer");
    const events: WatchRunResponse[] = [];
    const runId = id("ts-hello");
    const out = await submitAndWatch(acme, { runId, input: input("acme", id("s"), "Say hello.") }, { onEvent: (m) => events.push(m) });
    assert.equal(out.submitted.created, true);
    assert.equal(out.submitted.run?.runId, runId);
    assertContiguous(events);
    assert.equal(out.lastSeq, events.at(-1)?.seq);
    assert.match(out.result?.finalMessage ?? "", /ECHO: Say hello\./);
    assert.equal(out.result?.runTerminalState, "succeeded");
    assert.equal(events.at(-1)?.event?.eventType, "run.terminal");

    // The same request again is the same run (idempotent), and a watch
    // from a cursor replays only what follows it.
    const again = await acme.executor.submitRun({ runId, input: input("acme", "unused", "other") }).catch((e) => e);
    assert.ok(isTetherError(again, "run_id_conflict"), String(again));
    const tail: WatchRunResponse[] = [];
    for await (const m of watchRun(acme, runId, { afterSeq: events.at(-3)!.seq })) {
      tail.push(m);
    }
    assert.deepEqual(
      tail.map((m) => m.seq),
      events.slice(-2).map((m) => m.seq),
    );
  });

  test("U2 a dropped stream resumes from the last seq: every event once, in order", async () => {
    const proxy = await startProxy(stack.executor);
    try {
      const acme = client("acme-writer", proxy.address);
      const events: WatchRunResponse[] = [];
      const resumes: bigint[] = [];
      let dropped = 0;
      const out = await submitAndWatch(
        acme,
        { runId: id("ts-drop"), input: input("acme", id("s"), "[slow] count to ten") },
        {
          onEvent: (m) => {
            events.push(m);
            // Cut the connection twice mid-run: after the second event, and
            // two events after the first resume (events already buffered
            // before a cut still arrive; the resume follows them).
            if ((dropped === 0 && events.length === 2) || (dropped === 1 && resumes.length === 1 && m.seq === resumes[0] + 2n)) {
              dropped++;
              proxy.drop();
            }
          },
          onResume: (err, afterSeq) => {
            assert.ok(err instanceof TetherError);
            assert.equal(err.reason, "", "a transport failure, not a tether refusal");
            resumes.push(afterSeq);
          },
        },
      );
      assert.equal(dropped, 2);
      assert.ok(resumes.length >= 2, `resumed ${resumes.length} times (after ${resumes}) over ${events.length} events`);
      assert.ok(resumes[1] > resumes[0], "each resume starts after the last seq seen");
      assertContiguous(events);
      assert.equal(out.result?.runTerminalState, "succeeded");
      assert.match(out.result?.finalMessage ?? "", /count to ten/);
    } finally {
      await proxy.close();
    }
  });

  test("U2 errors are typed from ErrorInfo reasons, with BadRequest and RetryInfo details", async () => {
    const acme = client("acme-writer");
    const runId = id("ts-err");
    await submitAndWatch(acme, { runId, input: input("acme", id("s"), "hi") });

    // Another company's run answers exactly like a missing one (SPEC T2).
    const globex = client("globex-reader");
    const notFound = await globex.executor.getRun({ runId }).catch((e) => e);
    assert.ok(isTetherError(notFound, "run_not_found"), String(notFound));
    assert.equal(notFound.code, Code.NotFound);
    assert.equal(notFound.retryable, false);

    // No credentials.
    const anon = await client().executor.listRuns({}).catch((e) => e);
    assert.ok(isTetherError(anon, "caller_unauthenticated"), String(anon));
    assert.equal(anon.code, Code.Unauthenticated);

    // Invalid input: BadRequest names the fields.
    const bad = await acme.executor.submitRun({ runId: "../nope", input: { ...input("acme", "s", ""), task: { prompt: "" } } }).catch((e) => e);
    assert.ok(isTetherError(bad, "invalid_request"), String(bad));
    assert.equal(bad.code, Code.InvalidArgument);
    assert.deepEqual(bad.fieldViolations.map((v) => v.field).sort(), ["input.task.prompt", "run_id"]);
    assert.equal(bad.retryable, false);

    // A finished run cannot be steered: a permanent refusal.
    const ended = await acme.executor.steerRun({ runId, message: "more" }).catch((e) => e);
    assert.ok(isTetherError(ended, "native_run_already_terminal"), String(ended));
    assert.equal(ended.code, Code.FailedPrecondition);

    // A run that waits for a gateway (no gateway carries its labels) has no
    // live session yet: steering it is refused with RetryInfo.
    const queued = id("ts-queued");
    await acme.executor.submitRun({ runId: queued, input: input("acme", id("s"), "hi", { zone: "nowhere" }) });
    const later = await acme.executor.steerRun({ runId: queued, message: "more" }).catch((e) => e);
    assert.ok(isTetherError(later, "steering_temporarily_unavailable"), String(later));
    assert.equal(later.code, Code.Unavailable);
    assert.equal(later.retryDelayMs, 1000);
    assert.equal(later.retryable, true);
    const cancelled = await acme.executor.cancelRun({ runId: queued, scope: 1, reason: "test over" });
    assert.equal(cancelled.active, true);
  });

  test("U2 lists page with filter-bound tokens", async () => {
    const acme = client("acme-writer");
    const session = id("s-page");
    for (let i = 0; i < 3; i++) {
      await acme.executor.submitRun({ runId: id("ts-page"), input: input("acme", session, "[slow] hi", { zone: "nowhere" }) });
    }
    const seen: string[] = [];
    let pageToken = "";
    let first = "";
    do {
      const page = await acme.executor.listRuns({ normalizedSessionId: session, pageSize: 2, pageToken });
      seen.push(...page.runs.map((r) => r.runId));
      pageToken = page.nextPageToken;
      first ||= pageToken;
    } while (pageToken);
    assert.equal(seen.length, 3);
    assert.equal(new Set(seen).size, 3);
    const mismatch = await acme.executor.listRuns({ normalizedSessionId: "other", pageToken: first }).catch((e) => e);
    assert.ok(isTetherError(mismatch, "page_token_filter_mismatch"), String(mismatch));
    assert.deepEqual(
      mismatch.fieldViolations.map((v: { field: string }) => v.field),
      ["page_token"],
    );
    for (const runId of seen) {
      await acme.executor.cancelRun({ runId, scope: 1, reason: "test over" });
    }
    // The registry pages too (the demo's gateway is configured, not
    // registered: the operator may list it, and it holds at most a page).
    const gws = await client("operator").gateways.listGateways({ pageSize: 1 });
    assert.ok(gws.gateways.length <= 1);
  });

  test("U2 the Connect transport reaches the executor's HTTP port with the same tenancy", async (t) => {
    if (!stack.connectUrl) {
      t.skip("the executor serves no HTTP port (SPEC U3) in this stack");
      return;
    }
    const acme = createTetherClient({ connectBaseUrl: stack.connectUrl, token: stack.token("acme-writer") });
    const runId = id("ts-connect");
    const events: WatchRunResponse[] = [];
    const out = await submitAndWatch(acme, { runId, input: input("acme", id("s"), "over HTTP") }, { onEvent: (m) => events.push(m) });
    assertContiguous(events);
    assert.match(out.result?.finalMessage ?? "", /over HTTP/);
    const globex = createTetherClient({ connectBaseUrl: stack.connectUrl, token: stack.token("globex-reader") });
    const notFound = await globex.executor.getRun({ runId }).catch((e) => e);
    assert.ok(isTetherError(notFound, "run_not_found"), String(notFound));
  });
});
