// A drop-in for node-redlock v5 (`redlock` on npm): the same class, settings,
// Lock object, errors and "error" event, on the module's commands. One
// client: LEASE.ACQUIRE (one resource) or LEASE.MACQUIRE (several: all or
// nothing, one token), waiting on the server (BLOCK) instead of a retry
// loop. Several clients (independent masters): the quorum lease of design.md
// S9, one per resource. Every lock carries its fencing token and fence().

import { EventEmitter } from "node:events";

import { AlreadyHeld, FOREVER, FenceCall, Label, LeaseError, LeaseLost, Loss, checkStale, fenceArgs } from "./core";
import { RedisClient } from "./adapter";
import { Lease, LeaseClient } from "./client";
import { QuorumClient, QuorumLease } from "./quorum";

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

type Held = { kind: "one"; lease: Lease } | { kind: "quorum"; leases: QuorumLease[] };

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
    if (this.held.kind === "one") return this.resources.map(() => (this.held as { lease: Lease }).lease.token);
    return this.held.leases.map((l) => l.token);
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
    const at = this.resources.indexOf(resource);
    if (at < 0) throw new RangeError(`${resource} is not one of the lock's resources; nothing was sent`);
    if (this.held.kind === "quorum") return this.held.leases[at].fence(...call);
    const lease = this.held.lease;
    return this.redlock._one!._call(resource, fenceArgs(resource, lease.token, call));
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

const sortedUnique = (xs: string[]): string[] => [...new Set(xs)].sort();

/**
 * node-redlock's Redlock on the lease module. `new Redlock([client])` with
 * one ioredis or node-redis client (a server or a cluster); several clients
 * are independent masters and take quorum leases.
 */
export default class Redlock extends EventEmitter {
  public readonly clients: Set<Client>;
  public readonly settings: Settings;
  /** @internal */
  readonly _one: LeaseClient | null;
  /** @internal */
  readonly _quorum: QuorumClient | null;

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
    if (this.clients.size === 1) {
      this._one = new LeaseClient([...this.clients][0], { watchdog: false, label: settings.label });
      this._quorum = null;
    } else {
      this._one = null;
      this._quorum = new QuorumClient(this.clients, { watchdog: false, label: settings.label, onOutlier: (o) => this.emit("error", new LeaseError(`quorum master ${o.addr} left out: its clock is ${o.aheadMs} ms ahead`)) });
    }
  }

  /** Runs `.quit()` on every client (as node-redlock), after closing the
   * helper's own connections. */
  public async quit(): Promise<void> {
    await (this._one ?? this._quorum)!.close();
    await Promise.all([...this.clients].map((c) => (c as { quit(): Promise<unknown> }).quit()));
  }

  private merged(settings?: Partial<Settings>): Settings {
    return settings ? { ...this.settings, ...settings } : this.settings;
  }

  /** The server-side wait that replaces node-redlock's retry loop: as long as
   * its retries would have lasted (retryCount x retryDelay; -1: forever). */
  private blockMs(s: Settings): number | undefined {
    if (s.retryCount === -1) return FOREVER;
    const ms = Math.round(s.retryCount * s.retryDelay);
    return ms > 0 ? ms : undefined;
  }

  private stats(votesFor: Client[], against: Array<[Client, Error]>): Promise<ExecutionStats> {
    const membershipSize = this.clients.size;
    return Promise.resolve({
      membershipSize,
      quorumSize: Math.floor(membershipSize / 2) + 1,
      votesFor: new Set(votesFor),
      votesAgainst: new Map(against),
    });
  }

  private lockedError(resources: string[]): ResourceLockedError {
    return new ResourceLockedError(`The operation was applied to: 0 of the ${resources.length} requested resources.`);
  }

  private expirationOf(start: number, duration: number, s: Settings): number {
    return start + duration - (Math.round(s.driftFactor * duration) + 2);
  }

  /** Locks `resources` for `duration` ms: several resources all at once or
   * none. Waits on the server (in arrival order) for as long as the retries
   * would have lasted; ExecutionError when it could not. */
  public async acquire(resources: string[], duration: number, settings?: Partial<Settings>, watchdog = false): Promise<Lock> {
    checkDuration(duration);
    const s = this.merged(settings);
    const start = Date.now();
    const blockMs = this.blockMs(s);
    const clients = [...this.clients];
    let failure: Error;
    try {
      if (this._one) {
        const lease =
          resources.length === 1
            ? await this._one.acquire(resources[0], duration, { blockMs, watchdog, label: s.label })
            : await this._one.acquireMany(resources, duration, { blockMs, watchdog, label: s.label });
        if (lease) {
          const attempts = [this.stats(clients, [])];
          return new Lock(this, resources, lease._owner, attempts, this.expirationOf(start, duration, s), { kind: "one", lease });
        }
        failure = this.lockedError(resources);
      } else {
        const leases = await this.quorumAcquire(sortedUnique(resources), duration, blockMs, watchdog, s.label);
        if (leases) {
          const byResource = resources.map((r) => leases.find((l) => l.key === r)!);
          const committed = new Set(byResource[0].committed);
          const attempts = [this.stats(clients.filter((_, i) => committed.has(i)), [])];
          return new Lock(this, resources, byResource[0]._owner, attempts, this.expirationOf(start, duration, s), { kind: "quorum", leases: byResource });
        }
        failure = this.lockedError(resources);
      }
    } catch (e) {
      if (!(e instanceof LeaseError)) throw e;
      // A resource this Redlock holds already: contention with itself,
      // refused at once instead of waiting on itself.
      failure = e instanceof AlreadyHeld ? new ResourceLockedError(e.message) : e;
    }
    this.emit("error", failure);
    throw new ExecutionError("The operation was unable to achieve a quorum during its retry window.", [this.stats([], clients.map((c) => [c, failure]))]);
  }

  /** One quorum lease per resource, in sorted order, all or none (the ones
   * taken are released when one is not): no deadlock. */
  private async quorumAcquire(resources: string[], duration: number, blockMs: number | undefined, watchdog: boolean, label: Label): Promise<QuorumLease[] | null> {
    const until = blockMs ? performance.now() + blockMs : null;
    const leases: QuorumLease[] = [];
    for (const r of resources) {
      const left = until === null ? blockMs : Math.max(Math.round(until - performance.now()), 1);
      const lease = await this._quorum!.acquire(r, duration, { blockMs: left, watchdog, label });
      if (!lease) {
        await Promise.all(leases.map((l) => l.release().catch(() => false)));
        return null;
      }
      leases.push(lease);
    }
    return leases;
  }

  /** Unlocks the lock (ExecutionError when it was not held any more: expired
   * or taken; a lost reply is retried, a refusal is final). */
  public async release(lock: Lock, _settings?: Partial<Settings>): Promise<ExecutionResult> {
    lock.expiration = 0;
    const start = Date.now();
    const clients = [...this.clients];
    let ok: boolean;
    try {
      if (lock.held.kind === "one") ok = await lock.held.lease.release();
      else ok = (await Promise.all(lock.held.leases.map((l) => l.release()))).every(Boolean);
    } catch (e) {
      this.emit("error", e);
      throw new ExecutionError("The operation was unable to achieve a quorum during its retry window.", [this.stats([], clients.map((c) => [c, e as Error]))]);
    }
    if (!ok) {
      const err = this.lockedError(lock.resources);
      this.emit("error", err);
      throw new ExecutionError("The operation was unable to achieve a quorum during its retry window.", [this.stats([], clients.map((c) => [c, err]))]);
    }
    return { attempts: [this.stats(clients, [])], start };
  }

  /** Extends a held lock to `duration` ms from now: a new Lock (the old one
   * is invalidated, as in node-redlock). */
  public async extend(existing: Lock, duration: number, settings?: Partial<Settings>): Promise<Lock> {
    checkDuration(duration);
    if (existing.expiration < Date.now()) throw new ExecutionError("Cannot extend an already-expired lock.", []);
    const s = this.merged(settings);
    const start = Date.now();
    const clients = [...this.clients];
    let ok: boolean;
    try {
      if (existing.held.kind === "one") ok = await existing.held.lease.renew(duration);
      else ok = (await Promise.all(existing.held.leases.map((l) => l.renew(duration)))).every(Boolean);
    } catch (e) {
      ok = false;
      this.emit("error", checkStale(e));
    }
    if (!ok) {
      const err = this.lockedError(existing.resources);
      this.emit("error", err);
      throw new ExecutionError("The operation was unable to achieve a quorum during its retry window.", [this.stats([], clients.map((c) => [c, err]))]);
    }
    existing.expiration = 0;
    return new Lock(this, existing.resources, existing.value, [this.stats(clients, [])], this.expirationOf(start, duration, s), existing.held);
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
    const lock = await this.acquire(resources, duration, settings, true);
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
