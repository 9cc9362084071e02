// A drop-in for node-redlock v4 (`redlock@4`, CommonJS, callbacks and
// bluebird promises): `require("redis-lease/redlock-v4")` instead of
// `require("redlock")`. The same class (an EventEmitter with the statics
// `Redlock.Lock` and `Redlock.LockError`), options, methods and events, on
// the module's commands (the engine of src/locking.ts, shared with the v5
// drop-in): one client takes LEASE.ACQUIRE (or LEASE.MACQUIRE for several
// resources) and waits on the server instead of a retry loop; several
// clients (independent masters) take one quorum lease per resource. Every
// lock carries its fencing token and fence().

import { EventEmitter } from "node:events";

// CommonJS by design (`export =`, as v4): bluebird's `export =` types too.
// eslint-disable-next-line @typescript-eslint/no-require-imports
import Bluebird = require("bluebird");

import { FenceCall } from "./core.js";
import { ALL_IN, Client, Held, Locker, Retry, Votes } from "./locking.js";

type Callback<T> = ((err: Error | null, value?: T) => void) | undefined;

/** What node-redlock v4 names its scripts: there are none here (the
 * module's commands replace them); the options that rewrite them are
 * accepted and applied to these names, which are not used. */
const SCRIPTS = { lockScript: "LEASE.ACQUIRE", unlockScript: "LEASE.RELEASE", extendScript: "LEASE.RENEW" } as const;

const defaults = { driftFactor: 0.01, retryCount: 10, retryDelay: 200, retryJitter: 100 };

interface Options {
  driftFactor?: number;
  retryCount?: number;
  retryDelay?: number;
  retryJitter?: number;
  lockScript?: (script: string) => string;
  unlockScript?: (script: string) => string;
  extendScript?: (script: string) => string;
}

interface LockOptions {
  retryCount?: number;
  retryDelay?: number;
}

/** The error of a lock, unlock or extend that failed: `attempts`, the
 * attempts made (lock and extend). */
class LockError extends Error {
  attempts: number | undefined;
  constructor(message?: string, attempts?: number) {
    super(message || "Failed to lock the resource.");
    this.name = "LockError";
    this.attempts = attempts;
  }
}

/** A held lock: node-redlock v4's Lock plus `token`, `tokens` and
 * `fence()`. */
class Lock {
  /** @internal */
  _held: Held | undefined;
  /** @internal The resources `_held` holds. */
  _heldResources: string[] | undefined;

  constructor(
    public redlock: Redlock,
    public resource: string | string[],
    public value: string,
    public expiration: number,
    public attempts: number,
    public attemptsRemaining: number,
  ) {}

  unlock(callback?: Callback<void>): Bluebird<void> {
    return this.redlock.unlock(this, callback);
  }

  extend(ttl: number, callback?: Callback<Lock>): Bluebird<Lock> {
    return this.redlock.extend(this, ttl, callback);
  }

  /** The fencing token of the first resource (one master: of every
   * resource). */
  get token(): number {
    return this.tokens[0];
  }

  /** The fencing token of each resource, in the order of `resource`. */
  get tokens(): number[] {
    if (!this._held) throw new LockError("this lock was not taken by this Redlock: it has no token");
    return this.redlock._locker.tokens(this._held, this._heldResources!);
  }

  /** Runs `command` only while the lock's token is current on the first
   * resource (`LEASE.FENCE`): its reply, or StaleToken (nothing ran). */
  fence(...call: FenceCall): Promise<unknown> {
    return this.fenceOn(resourcesOf(this.resource)[0], ...call);
  }

  /** `fence` on one of the lock's resources. */
  async fenceOn(resource: string, ...call: FenceCall): Promise<unknown> {
    if (!this._held) throw new LockError("this lock was not taken by this Redlock: it has no token");
    return this.redlock._locker.fence(this._held, this._heldResources!, resource, call);
  }
}

const resourcesOf = (r: string | string[]): string[] => (Array.isArray(r) ? r : [r]);
const same = (a: string[], b: string[]): boolean => a.length === b.length && a.every((x, i) => x === b[i]);

/**
 * node-redlock v4's Redlock on the lease module: `new Redlock(clients,
 * options)` with one client (ioredis 4/5, node_redis v3, node-redis 4/5)
 * or several independent masters. Every method takes an optional
 * node-style callback and returns a bluebird promise.
 */
class Redlock extends EventEmitter {
  static Lock = Lock;
  static LockError = LockError;

  driftFactor: number;
  retryCount: number;
  retryDelay: number;
  retryJitter: number;
  lockScript: string;
  unlockScript: string;
  extendScript: string;
  servers: Client[];
  /** @internal */
  readonly _locker: Locker;

  constructor(clients: Client[], options: Options = {}) {
    super();
    options = options || {};
    const num = (k: keyof typeof defaults): number => (typeof options[k] === "number" ? (options[k] as number) : defaults[k]);
    this.driftFactor = num("driftFactor");
    this.retryCount = num("retryCount");
    this.retryDelay = num("retryDelay");
    this.retryJitter = num("retryJitter");
    const script = (k: keyof typeof SCRIPTS): string => (typeof options[k] === "function" ? options[k]!(SCRIPTS[k]) : SCRIPTS[k]);
    this.lockScript = script("lockScript");
    this.unlockScript = script("unlockScript");
    this.extendScript = script("extendScript");
    this.servers = clients;
    if (this.servers.length === 0) throw new Error("Redlock must be instantiated with at least one redis server.");
    // Client errors are "clientError" events, never "error" (as v4).
    this._locker = new Locker([...clients], undefined, (m) => this.emit("clientError", new Error(m)));
  }

  /** Runs `.quit()` on every client (after closing the helper's own
   * connections): their results. */
  quit(callback?: Callback<unknown[]>): Bluebird<unknown[]> {
    return Bluebird.resolve(this._locker.close())
      .then(() => Bluebird.map(this.servers, (c) => (c as { quit(): unknown }).quit()))
      .nodeify(callback);
  }

  acquire(resource: string | string[], ttl: number, callback?: Callback<Lock>): Bluebird<Lock> {
    return this._lock(resource, null, ttl, {}, callback);
  }

  lock(resource: string | string[], ttl: number, callback?: Callback<Lock>): Bluebird<Lock> {
    return this._lock(resource, null, ttl, {}, callback);
  }

  acquireWithOptions(resource: string | string[], ttl: number, options: LockOptions, callback?: Callback<Lock>): Bluebird<Lock> {
    return this._lock(resource, null, ttl, options, callback);
  }

  lockWithOptions(resource: string | string[], ttl: number, options: LockOptions, callback?: Callback<Lock>): Bluebird<Lock> {
    return this._lock(resource, null, ttl, options, callback);
  }

  /** The lock as a bluebird disposer, for `Promise.using`: unlocked after
   * the block (`errorHandler` gets the unlock's error). */
  disposer(resource: string | string[], ttl: number, errorHandler?: (err: Error) => void): Bluebird.Disposer<Lock> {
    const onError = errorHandler || ((): void => undefined);
    return this._lock(resource, null, ttl, {}).disposer((lock: Lock) => lock.unlock().catch(onError));
  }

  release(lock: Lock, callback?: Callback<void>): Bluebird<void> {
    return this.unlock(lock, callback);
  }

  /** Unlocks the lock at once (its expiration is 0 from now on): a
   * LockError when a quorum could not release it (not held any more, or
   * the clients failed). A lock whose `resource` was changed, or one made
   * of a resource and a value only, is released by name. */
  unlock(lock: Lock, callback?: Callback<void>): Bluebird<void> {
    const resources = resourcesOf(lock.resource);
    lock.expiration = 0;
    const held = lock._held && same(resources, lock._heldResources!) ? lock._held : undefined;
    return Bluebird.resolve(held ? this._locker.release(held) : this._locker.releaseByName({ resources, value: lock.value }))
      .then((votes) => {
        this.clientErrors(votes);
        if (this.servers.length - votes.against.size < this._locker.quorumSize) throw new LockError(`Unable to fully release the lock on resource "${String(lock.resource)}".`);
      })
      .nodeify(callback);
  }

  /** Extends the lock to `ttl` ms from now: the same Lock back. */
  extend(lock: Lock, ttl: number, callback?: Callback<Lock>): Bluebird<Lock> {
    if (lock.expiration < Date.now())
      return Bluebird.reject(new LockError(`Cannot extend lock on resource "${String(lock.resource)}" because the lock has already expired.`, 0)).nodeify(callback);
    const resources = resourcesOf(lock.resource);
    const held = lock._held && same(resources, lock._heldResources!) ? lock._held : undefined;
    const start = Date.now();
    return Bluebird.resolve(held ? this._locker.extend(held, ttl, false) : this._locker.extendByName({ resources, value: lock.value }, ttl))
      .then((against) => {
        this.clientErrors({ against, settled: ALL_IN });
        if (against.size > 0 && this.servers.length - against.size < this._locker.quorumSize)
          throw new LockError(`Exceeded ${this.retryCount} attempts to lock the resource "${String(lock.resource)}".`, 1);
        lock.expiration = start + ttl - this.drift(ttl);
        return lock;
      })
      .nodeify(callback);
  }

  private drift(ttl: number): number {
    return Math.round(this.driftFactor * ttl) + 2;
  }

  /** A "clientError" event for each failed client: those in now, and the
   * later ones as they come. */
  private clientErrors(votes: Votes): void {
    const seen = new Set<Client>();
    const emit = (): void => {
      for (const [c, a] of votes.against) {
        if (seen.has(c)) continue;
        seen.add(c);
        if (a.kind !== "locked") this.emit("clientError", a.error);
      }
    };
    emit();
    if (votes.settled !== ALL_IN) void votes.settled.then(emit);
  }

  /** Locks `resource` for `ttl` ms (`value` null; a value extends the lock
   * held with it, by name). v4's signature; `_lock(resource, value, ttl,
   * callback)` too. */
  _lock(resource: string | string[], value: string | null, ttl: number, options?: LockOptions | Callback<Lock>, callback?: Callback<Lock>): Bluebird<Lock> {
    if (typeof options === "function" && typeof callback === "undefined") {
      callback = options;
      options = {};
    }
    const opts = (options || {}) as LockOptions;
    const resources = resourcesOf(resource);
    // As v4: an option of 0 falls back to the instance's setting.
    const retry: Retry = { retryCount: opts.retryCount || this.retryCount, retryDelay: opts.retryDelay || this.retryDelay, retryJitter: this.retryJitter };
    if (value !== null) {
      const lock = new Lock(this, resource, value, Date.now() + ttl, 1, retry.retryCount - 1);
      return this.extend(lock, ttl, callback);
    }
    return Bluebird.resolve(this._locker.acquire(resources, ttl, false, retry, undefined))
      .then((got) => {
        for (const t of got.tries) this.clientErrors(t);
        const attempts = attemptsOf(got.tries.filter((t) => !t.waited).length, got.waitedMs, retry);
        if (!got.held) throw new LockError(`Exceeded ${retry.retryCount} attempts to lock the resource "${String(resource)}".`, attempts);
        const value = got.held.kind === "one" ? got.held.lease._owner : got.held.leases[0]._owner;
        const lock = new Lock(this, resource, value, got.start + ttl - this.drift(ttl), attempts, retry.retryCount - attempts);
        if (lock.expiration <= Date.now()) {
          // Granted too late to be of use, as v4 (the lock is given back).
          void this._locker.release(got.held);
          throw new LockError(`Exceeded ${retry.retryCount} attempts to lock the resource "${String(resource)}".`, attempts);
        }
        lock._held = got.held;
        lock._heldResources = resources;
        return lock;
      })
      .nodeify(callback);
  }
}

/** `attempts` of a v4 lock or LockError: the tries made, plus one per
 * `retryDelay` spent waiting on the server (the attempts v4 would have
 * made meanwhile), at most `retryCount + 1`. */
function attemptsOf(tries: number, waitedMs: number, retry: Retry): number {
  const n = Math.max(1, tries + (waitedMs > 0 ? Math.ceil(waitedMs / Math.max(retry.retryDelay, 1)) : 0));
  return retry.retryCount === -1 ? n : Math.min(n, retry.retryCount + 1);
}

type LockT = Lock;
type LockErrorT = LockError;
type OptionsT = Options;
type LockOptionsT = LockOptions;

// The types of the statics, for `let lock: Redlock.Lock` (as v4's typings).
// eslint-disable-next-line @typescript-eslint/no-namespace
declare namespace Redlock {
  type Lock = LockT;
  type LockError = LockErrorT;
  type Options = OptionsT;
  type LockOptions = LockOptionsT;
}

export = Redlock;
