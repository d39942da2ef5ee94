// @tether-run/client: a TypeScript client of tether's executor API.
export * from "./client.js";
export * from "./errors.js";
export * from "./watch.js";
export type { Reason, RetryClass } from "./reasons.js";
export { REASONS } from "./reasons.js";
export * from "./gen/tether/executor/v1/executor_pb.js";
export * from "./gen/tether/executor/v1/fleet_pb.js";
export * as prp from "./gen/tether/prp/v1/execution_pb.js";
export * as events from "./gen/tether/prp/v1/event_pb.js";
export * as rpc from "./gen/google/rpc/error_details_pb.js";
