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
} from "./core";
export type { Arg, FenceCall, FenceOptions, Label, Loss, ModeOptions, Outlier, Waiter } from "./core";
export type { RedisClient } from "./adapter";
export { LeaseClient, Lease, MultiLease } from "./client";
export type { ClientOptions, AcquireOptions } from "./client";
export { QuorumClient, QuorumLease } from "./quorum";
export type { QuorumOptions } from "./quorum";
export { default as Redlock, Lock, ExecutionError, ResourceLockedError } from "./redlock";
export type { Settings, ExecutionStats, ExecutionResult, RedlockAbortSignal } from "./redlock";
