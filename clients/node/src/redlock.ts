// A drop-in for node-redlock v5 (`redlock` on npm): the same class, settings,
// Lock object, errors and "error" event, on the module's commands. One
// client: LEASE.ACQUIRE (one resource) or LEASE.MACQUIRE (several: all or
// nothing, one token), waiting on the server (BLOCK) instead of a retry
// loop. Several clients (independent masters): the quorum lease of design.md
// S9, one per resource. Every lock carries its fencing token and fence().

import { EventEmitter } from "node:events";

import { FenceCall, Label, LeaseError, LeaseLost, Loss } from "./core.js";
import { RedisClient } from "./adapter.js";
import { LeaseClient } from "./client.js";
import { ALL_IN, Held, Locker, Votes } from "./locking.js";

type Client = RedisClient;

export interface Settings {
  readonly driftFactor: number;
  readonly retryCount: number;
  readonly retryDelay: number;
  readonly retryJitter: number;
  readonly automaticExtensionThreshold: number;
  /** Not node-redlock's: the label of the locks' acquires (`LABEL`, shown by
   * `LEASE.INFO` and `LEASE.WAITERS`). undefined: this process's
   * `defaultLabel()` (`<host> pid <pid> <program>`); null: none. */
  readonly label?: Label;
}

const defaultSettings: Readonly<Settings> = Object.freeze({
  driftFactor: 0.01,
  retryCount: 10,
  retryDelay: 200,
  retryJitter: 100,
  automaticExtensionThreshold: 500,
});

export type ExecutionStats = {
  readonly membershipSize: number;
  readonly quorumSize: number;
  readonly votesFor: Set<Client>;
  readonly votesAgainst: Map<Client, Error>;
};

export type ExecutionResult = {
  attempts: ReadonlyArray<Promise<ExecutionStats>>;
  start: number;
};

/** One or more of the resources is locked by another holder (a vote
 * against, as in node-redlock). */
export class ResourceLockedError extends Error {
  constructor(public override readonly message: string) {
    super(message);
    this.name = "ResourceLockedError";
  }
}

/** An operation did not pass on a quorum (within the wait, for acquire). */
export class ExecutionError extends Error {
  constructor(
    public override readonly message: string,
    public readonly attempts: ReadonlyArray<Promise<ExecutionStats>>,
  ) {
    super(message);
    this.name = "ExecutionError";
  }
}

export type RedlockAbortSignal = AbortSignal & { error?: Error };

/** A held lock: node-redlock's Lock plus `token`, `tokens` and `fence()`. */
export class Lock {
  /** @internal */
  readonly held: Held;

  /** @internal */
  constructor(
    public readonly redlock: Redlock,
    public readonly resources: string[],
    public readonly value: string,
    public readonly attempts: ReadonlyArray<Promise<ExecutionStats>>,
    public expiration: number,
    held: Held,
  ) {
    this.held = held;
  }

  /** The fencing token of the first resource (on one master, every resource
   * of the lock has this one token). */
  get token(): number {
    return this.tokens[0];
  }

  /** The fencing token of each resource, in the order of `resources`. */
  get tokens(): number[] {
    return this.redlock._locker.tokens(this.held, this.resources);
  }

  /** Runs `command` on the first resource's server only if the token is
   * still current there (`LEASE.FENCE`), in one atomic step: its reply, or
   * StaleToken (nothing ran). With several masters: on the majority that
   * committed the token. */
  fence(...call: FenceCall): Promise<unknown> {
    return this.fenceOn(this.resources[0], ...call);
  }

  /** `fence` on one of the lock's resources (options, `{ minTtlMs }`,
   * after the resource). */
  async fenceOn(resource: string, ...call: FenceCall): Promise<unknown> {
    return this.redlock._locker.fence(this.held, this.resources, resource, call);
  }

  async release(): Promise<ExecutionResult> {
    return this.redlock.release(this);
  }

  async extend(duration: number): Promise<Lock> {
    return this.redlock.extend(this, duration);
  }
}

function checkDuration(duration: number): void {
  if (Math.floor(duration) !== duration) throw new Error("Duration must be an integer value in milliseconds.");
}

const QUORUM_FAILED = "The operation was unable to achieve a quorum during its retry window.";

/**
 * node-redlock's Redlock on the lease module. `new Redlock([client])` with
 * one ioredis or node-redis client (a server or a cluster); several clients
 * are independent masters and take quorum leases.
 */
export default class Redlock extends EventEmitter {
  public readonly clients: Set<Client>;
  public readonly settings: Settings;
  /** @internal */
  readonly _locker: Locker;

  public constructor(clients: Iterable<Client>, settings: Partial<Settings> = {}, _scripts: unknown = {}) {
    super();
    // As node-redlock: "error" events are for observability and never crash.
    this.on("error", () => undefined);
    this.clients = new Set(clients);
    if (this.clients.size === 0) throw new Error("Redlock must be instantiated with at least one redis client.");
    const pick = (k: Exclude<keyof Settings, "label">): number => (typeof settings[k] === "number" ? (settings[k] as number) : defaultSettings[k]);
    this.settings = {
      driftFactor: pick("driftFactor"),
      retryCount: pick("retryCount"),
      retryDelay: pick("retryDelay"),
      retryJitter: pick("retryJitter"),
      automaticExtensionThreshold: pick("automaticExtensionThreshold"),
      ...(settings.label !== undefined ? { label: settings.label } : {}),
    };
    this._locker = new Locker([...this.clients], settings.label, (m) => this.emit("error", new LeaseError(m)));
  }

  /** @internal */
  get _one(): LeaseClient | null {
    return this._locker.one;
  }

  /** Runs `.quit()` on every client (as node-redlock), after closing the
   * helper's own connections. */
  public async quit(): Promise<void> {
    await this._locker.close();
    await Promise.all([...this.clients].map((c) => (c as { quit(): Promise<unknown> }).quit()));
  }

  private merged(settings?: Partial<Settings>): Settings {
    return settings ? { ...this.settings, ...settings } : this.settings;
  }

  /** One attempt's votes as node-redlock reports them: a resource held by
   * another lock (or a key of another type) is a ResourceLockedError; a
   * failed client its error (an unreachable server: "Connection is
   * closed."; an error reply: the library's). Each vote against is also an
   * "error" event, as it comes; the stats resolve once every vote is in (a
   * client that had not answered when a majority decided votes when it
   * does, as in node-redlock). */
  private stats(votes: Votes, resources: string[]): Promise<ExecutionStats> {
    const votesAgainst = new Map<Client, Error>();
    const count = (): void => {
      for (const [c, a] of votes.against) {
        if (votesAgainst.has(c)) continue;
        const e = a.kind === "error" ? a.error : this.lockedError(resources);
        votesAgainst.set(c, e);
        this.emit("error", e);
      }
    };
    count();
    return votes.settled.then(() => {
      count();
      return {
        membershipSize: this.clients.size,
        quorumSize: this._locker.quorumSize,
        votesFor: new Set([...this.clients].filter((c) => !votesAgainst.has(c))),
        votesAgainst,
      };
    });
  }

  private lockedError(resources: string[]): ResourceLockedError {
    return new ResourceLockedError(`The operation was applied to: 0 of the ${resources.length} requested resources.`);
  }

  private expirationOf(start: number, duration: number, s: Settings): number {
    return start + duration - (Math.round(s.driftFactor * duration) + 2);
  }

  /** Locks `resources` for `duration` ms (any length: the server lease is
   * renewed until then), several resources all at once or none. One master:
   * a try, then a wait on the server (in arrival order) for as long as the
   * retries would have lasted; several: a try every `retryDelay`. A client
   * that fails is tried again every `retryDelay`, `retryCount` times.
   * ExecutionError when it could not, its `attempts` each try's votes. */
  public async acquire(resources: string[], duration: number, settings?: Partial<Settings>): Promise<Lock> {
    return this.acquireFor(resources, duration, this.merged(settings), false);
  }

  private async acquireFor(resources: string[], duration: number, s: Settings, forever: boolean): Promise<Lock> {
    checkDuration(duration);
    const got = await this._locker.acquire(resources, duration, forever, s, s.label);
    const attempts = got.tries.map((t) => this.stats(t, resources));
    if (!got.held) throw new ExecutionError(QUORUM_FAILED, attempts);
    const value = got.held.kind === "one" ? got.held.lease._owner : got.held.leases[0]._owner;
    return new Lock(this, resources, value, attempts, this.expirationOf(got.start, duration, s), got.held);
  }

  /** Unlocks the lock: ExecutionError when a quorum could not release it
   * (not held any more: expired or taken; or the clients failed). A lost
   * reply is retried, a refusal is final. */
  public async release(lock: Lock, _settings?: Partial<Settings>): Promise<ExecutionResult> {
    lock.expiration = 0;
    const start = Date.now();
    const votes = await this._locker.release(lock.held);
    const attempts = [this.stats(votes, lock.resources)];
    if (this.clients.size - votes.against.size < this._locker.quorumSize) throw new ExecutionError(QUORUM_FAILED, attempts);
    return { attempts, start };
  }

  /** Extends a held lock to `duration` ms from now (any length): a new Lock
   * (the old one is invalidated, as in node-redlock). */
  public async extend(existing: Lock, duration: number, settings?: Partial<Settings>): Promise<Lock> {
    checkDuration(duration);
    if (existing.expiration < Date.now()) throw new ExecutionError("Cannot extend an already-expired lock.", []);
    return this.extendFor(existing, duration, this.merged(settings), false);
  }

  private async extendFor(existing: Lock, duration: number, s: Settings, forever: boolean): Promise<Lock> {
    const start = Date.now();
    const against = await this._locker.extend(existing.held, duration, forever);
    const attempts = [this.stats({ against, settled: ALL_IN }, existing.resources)];
    if (against.size > 0) throw new ExecutionError(QUORUM_FAILED, attempts);
    existing.expiration = 0;
    return new Lock(this, existing.resources, existing.value, attempts, this.expirationOf(start, duration, s), existing.held);
  }

  public async using<T>(resources: string[], duration: number, settings: Partial<Settings>, routine?: (signal: RedlockAbortSignal) => Promise<T>): Promise<T>;
  public async using<T>(resources: string[], duration: number, routine: (signal: RedlockAbortSignal) => Promise<T>): Promise<T>;
  /** Runs `routine(signal)` holding the lock, renewed in the background
   * (every third of `duration`) until it ends, then released. `signal` is
   * aborted the moment the lock is lost: `signal.error` is an
   * ExecutionError, and `signal.reason` a LeaseLost saying "refused" or
   * "expired". */
  public async using<T>(
    resources: string[],
    duration: number,
    settingsOrRoutine: undefined | Partial<Settings> | ((signal: RedlockAbortSignal) => Promise<T>),
    optionalRoutine?: (signal: RedlockAbortSignal) => Promise<T>,
  ): Promise<T> {
    checkDuration(duration);
    const settings = settingsOrRoutine && typeof settingsOrRoutine !== "function" ? this.merged(settingsOrRoutine) : this.settings;
    const routine = optionalRoutine ?? settingsOrRoutine;
    if (typeof routine !== "function") throw new Error("INVARIANT: routine is not a function.");
    if (settings.automaticExtensionThreshold > duration - 100)
      throw new Error("A lock `duration` must be at least 100ms greater than the `automaticExtensionThreshold` setting.");
    const lock = await this.acquireFor(resources, duration, settings, true);
    const controller = new AbortController();
    const signal = controller.signal as RedlockAbortSignal;
    const inner = lock.held.kind === "one" ? [lock.held.lease.signal] : lock.held.leases.map((l) => l.signal);
    const onLoss = (e: Event): void => {
      const reason = (e.target as AbortSignal).reason as LeaseLost;
      const loss: Loss = reason?.loss ?? "expired";
      if (loss === "released" || signal.aborted) return;
      signal.error = new ExecutionError(`The lock was lost (${loss}): exclusivity can no longer be guaranteed.`, []);
      this.emit("error", signal.error);
      controller.abort(reason);
    };
    for (const s of inner) s.addEventListener("abort", onLoss, { once: true });
    try {
      return await routine(signal);
    } finally {
      for (const s of inner) s.removeEventListener("abort", onLoss);
      if (!signal.aborted) await this.release(lock);
      else await this.release(lock).catch(() => undefined);
    }
  }
}

export { Redlock };
