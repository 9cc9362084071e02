// redis-lease: fenced leases for Redis and Valkey on ioredis or node-redis.
export {
  FOREVER,
  LeaseError,
  LeaseBusy,
  LeaseGrace,
  LeaseLost,
  StaleToken,
  LeaseExpiring,
  SharedWrite,
  Fenced,
  AlreadyHeld,
  ReplyTimeout,
  keySlot,
  drift,
  defaultLabel,
} from "./core.js";
export type { Arg, FenceCall, FenceOptions, Label, Loss, ModeOptions, Outlier, Waiter } from "./core.js";
export type { RedisClient } from "./adapter.js";
export { LeaseClient, Lease, MultiLease } from "./client.js";
export type { ClientOptions, AcquireOptions } from "./client.js";
export { QuorumClient, QuorumLease } from "./quorum.js";
export type { QuorumOptions } from "./quorum.js";
export { default as Redlock, Lock, ExecutionError, ResourceLockedError } from "./redlock.js";
export type { Settings, ExecutionStats, ExecutionResult, RedlockAbortSignal } from "./redlock.js";
