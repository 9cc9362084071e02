// redis-lease as an ES module: the CommonJS build (dist/src) re-exported,
// one copy of every class whether you import or require the package.
import cjs from "../dist/src/index.js";

export const {
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
  LeaseClient,
  Lease,
  MultiLease,
  QuorumClient,
  QuorumLease,
  Redlock,
  Lock,
  ExecutionError,
  ResourceLockedError,
} = cjs;
