// LeaseClient: leases on one server or a Redis Cluster, over the ioredis or
// node-redis client the user passes. The rules are core.ts's; this file
// does the I/O.

import {
  AlreadyHeld,
  Arg,
  Attempts,
  Batch,
  FenceCall,
  FenceOptions,
  LeaseBusy,
  LeaseError,
  Label,
  ReplyTimeout,
  LeaseGrace,
  LeaseLost,
  Loss,
  ModeOptions,
  Schedule,
  Signal,
  acquireArgs,
  checkStale,
  checkTtl,
  checkedKeys,
  deadlineAfter,
  fenceArgs,
  graceOf,
  guardArgs,
  guarded,
  labelArgs,
  labelOf,
  lossReason,
  lostReply,
  macquireArgs,
  modeArgs,
  mreleaseArgs,
  mrenewArgs,
  needsFreshRenewal,
  newOwner,
  parseWaiters,
  now,
  releaseAttempts,
  releasePlan,
  renewEvery,
  SHORT_MS,
  unguardArgs,
  unguarded,
  Waiter,
  waitersArgs,
  withBlock,
} from "./core.js";
import { Dedicated, RedisClient, Target, targetOf } from "./adapter.js";

export interface ClientOptions {
  /** How long any one reply may take, ms (5000). */
  ioTimeoutMs?: number;
  /** A `BLOCK n` acquire waits for its reply n + this, ms (2000). */
  blockMarginMs?: number;
  /** A lost acquire or release reply is sent again this many times, with
   * the same owner (3). */
  retries?: number;
  /** Renew every lease at a third of its ttl in the background (true). */
  watchdog?: boolean;
  /** The label of this client's acquires (`LABEL`, shown by `LEASE.INFO`
   * and `LEASE.WAITERS`): undefined for this process's `defaultLabel()`
   * (`<host> pid <pid> <program>`), a string or Buffer (cut to 256 bytes),
   * or null for none. */
  label?: Label;
}

export interface AcquireOptions extends ModeOptions {
  /** undefined: no wait; n: wait up to n ms on the server (`BLOCK n`);
   * `FOREVER` (0): until the lease is ours. */
  blockMs?: number;
  /** This lease renewed by the client's watchdog (the client's setting). */
  watchdog?: boolean;
  /** This acquire's label (undefined: the client's; null: none). Sent
   * unchanged on every retry. */
  label?: Label;
  /** @internal Wait even on a key this client holds (the Redlock drop-ins:
   * node-redlock's locks of one instance are independent of each other). */
  _selfWait?: boolean;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, Math.max(ms, 0)));

/** The loss signal of one lease: lost, for good, the moment a renewal is
 * refused, the client-side deadline passes (ttl after the acquire, or the
 * last successful renewal, was sent) or the lease is released. Its
 * AbortSignal (reason: a LeaseLost whose `loss` says which) is made when
 * first asked for, and only then is a timer armed at the deadline: an
 * AbortSignal and a timer cost more than a round trip's tenth, and most
 * leases are released without anyone listening. */
class LossSignal implements Signal {
  private controller: AbortController | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private lostWith: Loss | null = null;
  constructor(private dl: number) {}
  get signal(): AbortSignal {
    if (!this.controller) {
      this.controller = new AbortController();
      if (this.isSet()) this.controller.abort(lossReason(this.lostWith!));
      else this.arm();
    }
    return this.controller.signal;
  }
  private arm(): void {
    if (!this.controller) return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => this.check(), Math.max(this.dl - now(), 0) + 1);
    this.timer.unref?.();
  }
  private check(): void {
    if (this.lostWith === null && now() >= this.dl) this.lose("expired");
    else if (this.lostWith === null) this.arm();
  }
  get deadline(): number {
    return this.dl;
  }
  get loss(): Loss | null {
    if (this.lostWith === null && now() >= this.dl) this.lose("expired");
    return this.lostWith;
  }
  isSet(): boolean {
    return this.loss !== null;
  }
  extend(sent: number, ttlMs: number): boolean {
    if (this.isSet()) return false;
    if (sent + ttlMs > this.dl) {
      this.dl = sent + ttlMs;
      this.arm();
    }
    return true;
  }
  lose(loss: Loss): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    if (this.lostWith !== null) return;
    this.lostWith = loss;
    this.controller?.abort(lossReason(loss));
  }
}

/** A held lease: `token`, `signal` (aborted when lost), `fence()`,
 * `renew()`, `release()`. `await using` releases it. */
export class Lease {
  /** The fencing token. */
  readonly token: number;
  protected released = false;
  protected watched: number | null = null;
  private watchedTtl: number;
  protected readonly count: number = 1;
  /** @internal */
  readonly lossSignal: LossSignal;

  /** @internal */
  constructor(
    protected readonly client: LeaseClient,
    readonly key: string,
    protected readonly owner: string,
    token: number,
    readonly ttlMs: number,
    deadline: number,
    watchdog: boolean,
    keys?: string[],
  ) {
    this.token = token;
    this.count = keys ? keys.length : 1;
    this.watchedTtl = ttlMs;
    this.lossSignal = new LossSignal(deadline);
    if (watchdog) {
      const first = deadline - ttlMs + renewEvery(ttlMs);
      this.watched = client._watch(key, owner, ttlMs, first, this.lossSignal, keys, this);
    }
  }

  /** @internal The owner id (the holder's credential: never logged). */
  get _owner(): string {
    return this.owner;
  }

  /** @internal Renewed by the watchdog (its ttl each time) until `until`
   * (performance.now() ms; null: for as long as it is held), the last
   * renewal asking only for the time left: a lock longer than the server's
   * `lease.max-ttl-ms`. Just renewed (or acquired): the next renewal is a
   * third of the ttl from now. */
  _renewUntil(until: number | null, ttlMs: number = this.ttlMs): void {
    if (this.released || this.lost) return;
    if (this.watched !== null) this.client._setUntil(this.watched, until, now() + renewEvery(this.watchedTtl));
    else if (until === null || until > this.deadline) {
      this.watchedTtl = ttlMs;
      this.watched = this.client._watch(this.key, this.owner, ttlMs, now() + renewEvery(ttlMs), this.lossSignal, this instanceof MultiLease ? this.keys : undefined, this, until);
    }
  }

  /** Aborted the moment the lease is lost or released; `signal.reason` is a
   * LeaseLost whose `loss` is "refused", "expired" or "released". */
  get signal(): AbortSignal {
    return this.lossSignal.signal;
  }

  /** Lost or released (the deadline is checked here too). */
  get lost(): boolean {
    return this.lossSignal.isSet();
  }

  /** Why the lease ended: "refused", "expired", "released", or null. */
  get loss(): Loss | null {
    return this.lossSignal.loss;
  }

  /** The client-side deadline (performance.now() ms). */
  get deadline(): number {
    return this.lossSignal.deadline;
  }

  toString(): string {
    return `Lease(${this.key}, token ${this.token}, ${this.loss ?? "held"})`;
  }

  /** `LEASE.FENCE key token [MINTTL ms] command...`, for a pipeline of
   * your own. */
  fenceArgs(...call: FenceCall): Arg[] {
    return fenceArgs(this.key, this.token, call);
  }

  /** Runs `command` only if the token is current, in one atomic step: its
   * reply, or StaleToken (nothing ran). Options first:
   * `fence({ minTtlMs: 5000 }, ...command)` also refuses, with
   * LeaseExpiring (nothing ran, the lease still held), when the lease has
   * less than 5 s left; with no command it only checks. A command that
   * writes a key whose hash tag another key guards rejects with Fenced
   * (nothing ran): fence it through a lease on that guard. */
  async fence(...call: FenceCall): Promise<unknown> {
    return this.client._call(this.key, this.fenceArgs(...call));
  }

  protected renewArgs(ttlMs: number): Arg[] {
    return ["LEASE.RENEW", this.key, this.owner, ttlMs];
  }

  protected releaseArgs(): Arg[] {
    return ["LEASE.RELEASE", this.key, this.owner];
  }

  protected leftoverArgs(): Arg[][] {
    return [];
  }

  /** Renews now (for `ttlMs`, the lease's ttl unless given): true, or false
   * when the lease is not ours (lost): the renewal was refused, no reply
   * came before the deadline, or the lease was lost before (nothing sent). */
  async renew(ttlMs: number = this.ttlMs): Promise<boolean> {
    if (this.lost) return false;
    const sent = now();
    // Until just past the deadline (a timer may fire up to a millisecond
    // early), so that a renewal that times out there finds the lease lost.
    const timeout = Math.min(Math.max(Math.ceil(this.deadline - sent) + 1, 1), this.client.ioTimeoutMs);
    let reply: unknown;
    try {
      reply = await this.client._call(this.key, this.renewArgs(ttlMs), timeout);
    } catch (e) {
      // No reply before the deadline: lost.
      if (e instanceof ReplyTimeout && this.lost) return false;
      throw e;
    }
    if (reply === this.count) return this.lossSignal.extend(sent, ttlMs);
    this.lossSignal.lose("refused");
    return false;
  }

  /** Gives the lease back and stops its renewals: true when it was ours. A
   * lost reply is sent again (same owner); once the lease is known lost it
   * waits little (past its deadline) or sends nothing (refused). */
  async release(): Promise<boolean> {
    if (this.released) return false;
    this.released = true;
    const plan = releasePlan(this.lossSignal.loss);
    this.lossSignal.lose("released");
    if (this.watched !== null) this.client._forget(this.watched, this);
    this.client._unhold(this);
    const attempts = releaseAttempts(plan, this.client.ioTimeoutMs, this.client.retries);
    for (let n = 0; n < attempts.length; n++) {
      let reply: unknown;
      try {
        reply = await this.client._call(this.key, this.releaseArgs(), attempts[n]);
      } catch (e) {
        if (lostReply(e)) {
          if (n + 1 < attempts.length) continue;
          if (plan === "short") return false;
        }
        throw e;
      }
      if (reply === this.count) return true;
      break;
    }
    for (const args of this.leftoverArgs()) await this.client._call(args[1] as string, args, SHORT_MS).catch(() => undefined);
    return false;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }
}

/** Several keys held at once, under one token (`LEASE.MACQUIRE`). */
export class MultiLease extends Lease {
  /** @internal */
  constructor(client: LeaseClient, readonly keys: string[], owner: string, token: number, ttlMs: number, deadline: number, watchdog: boolean) {
    super(client, keys[0], owner, token, ttlMs, deadline, watchdog, keys);
  }

  override toString(): string {
    return `MultiLease(${this.keys.join(", ")}, token ${this.token}, ${this.loss ?? "held"})`;
  }

  /** `LEASE.FENCE key token [MINTTL ms] command...` on `key`, one of the
   * lease's keys: `fenceArgs(key, ...command)` or
   * `fenceArgs(key, { minTtlMs }, ...command)`. */
  override fenceArgs(key?: Arg | FenceOptions, ...call: FenceCall): Arg[] {
    if (typeof key !== "string" || !this.keys.includes(key)) throw new RangeError(`${String(key)} is not one of the lease's keys; nothing was sent`);
    return fenceArgs(key, this.token, call);
  }

  /** `fence(key, ...command)` or `fence(key, { minTtlMs }, ...command)`. */
  override async fence(key?: Arg | FenceOptions, ...call: FenceCall): Promise<unknown> {
    const args = this.fenceArgs(key, ...call);
    return this.client._call(args[1] as string, args);
  }

  protected override renewArgs(ttlMs: number): Arg[] {
    return mrenewArgs(this.keys, this.owner, ttlMs);
  }

  protected override releaseArgs(): Arg[] {
    return mreleaseArgs(this.keys, this.owner);
  }

  /** After a refused renewal or an MRELEASE that freed nothing: each key
   * still ours released on its own (another owner's key answers 0). */
  protected override leftoverArgs(): Arg[][] {
    return this.keys.map((k) => ["LEASE.RELEASE", k, this.owner]);
  }
}

/** Takes leases on one server or a cluster through `client` (ioredis or
 * node-redis). Its leases share the client's connection (blocking acquires
 * take one of their own) and one watchdog, which sends the renewals due as
 * one pipeline per node. */
export class LeaseClient {
  readonly ioTimeoutMs: number;
  readonly blockMarginMs: number;
  readonly retries: number;
  readonly watchdog: boolean;
  /** The label of this client's acquires: a text, or null for none. */
  readonly label: string | Buffer | null;
  /** @internal */
  readonly target: Target;
  private readonly held = new Map<string, WeakRef<Lease>>();
  private readonly schedule = new Schedule();
  private readonly gone = new FinalizationRegistry<number>((id) => this.schedule.remove(id));
  private running = false;
  private wake: (() => void) | null = null;
  private wakeTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(client: RedisClient, options: ClientOptions = {}) {
    this.target = targetOf(client);
    this.ioTimeoutMs = options.ioTimeoutMs ?? 5000;
    this.blockMarginMs = options.blockMarginMs ?? 2000;
    this.retries = options.retries ?? 3;
    this.watchdog = options.watchdog ?? true;
    this.label = labelOf(options.label);
  }

  /** Closes the helper's own connections (not the client you passed). */
  async close(): Promise<void> {
    await this.target.close();
  }

  watchdogStats(): { leases: number; renewals: number; roundTrips: number } {
    return this.schedule.stats();
  }

  /** The clients waiting for `key` with `BLOCK`, oldest first
   * (`LEASE.WAITERS key [COUNT count]`): at most `count` (1 to 1000;
   * undefined: the server's default, 10). Empty when nobody waits. It reads
   * the key's master (waiters live there). */
  async waiters(key: string, options: { count?: number } = {}): Promise<Waiter[]> {
    return parseWaiters(await this._call(key, waitersArgs(key, options.count)));
  }

  /** `LEASE.GUARD key`, an admin call (design.md S12): from now on `key`, a
   * lease key with a hash tag (`{acct:7}:lock`), guards that tag. Every
   * other key of its database with the tag (`{acct:7}`, `{acct:7}:log`) can
   * then be written only through `LEASE.FENCE key token ...` with the token
   * of the lease held on `key`, which is what `lease.fence(...)` of a lease
   * on `key` sends; any other write is refused with Fenced, and changes
   * nothing. Reads pass. The key stays, free, when its lease ends; it holds
   * exclusive leases only (no `shared`/`limit`). Guarding a key that guards
   * already does nothing.
   *
   * The server's refusals reject with its error reply: a key with no hash
   * tag, a tag another key guards, a key held with LIMIT or SHARED,
   * WRONGTYPE. Sent once: it is idempotent, so call it again after a lost
   * reply. On a cluster it goes to the key's master. */
  async guard(key: string): Promise<void> {
    guarded(await this._call(key, guardArgs(key)));
  }

  /** `LEASE.UNGUARD key`: `key` stops guarding its hash tag, whose keys can
   * be written by anyone again. true when it guarded, false when it did not
   * (nothing changes then). Its lease, if one is held, is not touched. */
  async unguard(key: string): Promise<boolean> {
    return unguarded(await this._call(key, unguardArgs(key)));
  }

  /** @internal */
  async _call(key: string, args: Arg[], timeoutMs = this.ioTimeoutMs): Promise<unknown> {
    try {
      return await this.target.call(key, args, timeoutMs);
    } catch (e) {
      throw checkStale(e);
    }
  }

  /** @internal Moves the end of a lease watched until an end. */
  _setUntil(id: number, until: number | null, next: number): void {
    if (this.schedule.setUntil(id, until, next) && this.running && this.wake) this.wake();
  }

  /** @internal */
  _forget(id: number, lease: Lease): void {
    this.schedule.remove(id);
    this.gone.unregister(lease);
  }

  /** @internal */
  _unhold(lease: Lease): void {
    const keys = lease instanceof MultiLease ? lease.keys : [lease.key];
    for (const k of keys) if (this.held.get(k)?.deref() === lease) this.held.delete(k);
  }

  /** @internal */
  _watch(key: string, owner: string, ttlMs: number, first: number, signal: Signal, keys: string[] | undefined, lease: Lease, until: number | null = null): number {
    const [id, wake] = this.schedule.add(key, owner, ttlMs, first, signal, keys, until);
    // A lease dropped without release() is collected: its renewals end.
    this.gone.register(lease, id, lease);
    if (!this.running) void this.runWatchdog();
    else if (wake && this.wake) this.wake();
    return id;
  }

  private async runWatchdog(): Promise<void> {
    this.running = true;
    try {
      for (;;) {
        const t = now();
        const step = this.schedule.next(t, this.ioTimeoutMs);
        if (step === null) return;
        if (!(step instanceof Batch)) {
          await new Promise<void>((resolve) => {
            this.wake = resolve;
            this.wakeTimer = setTimeout(resolve, Math.max(step - t, 1));
            // The watchdog alone does not keep the process alive.
            this.wakeTimer.unref?.();
          });
          clearTimeout(this.wakeTimer);
          this.wake = null;
          continue;
        }
        const [replies, pipelines] = await this.target.batch(step.keys, step.args, step.timeout);
        this.schedule.settle(step, replies, pipelines);
      }
    } finally {
      this.running = false;
    }
  }

  private checkHeld(keys: string[]): void {
    for (const k of keys) {
      const lease = this.held.get(k)?.deref();
      if (lease && !lease.lost) throw new AlreadyHeld(k);
    }
  }

  /** Takes the lease on `key` for `ttlMs`: the Lease, or null when another
   * owner holds it (after the wait, if any); LeaseGrace when the server
   * refused it for its grace period; AlreadyHeld when this client holds it. */
  async acquire(key: string, ttlMs: number, options: AcquireOptions = {}): Promise<Lease | null> {
    checkTtl(ttlMs, options.blockMs);
    const mode = modeArgs(options);
    if (!options._selfWait) this.checkHeld([key]);
    const owner = newOwner();
    const base = acquireArgs(key, owner, ttlMs, mode, labelArgs(labelOf(options.label, this.label)));
    const watchdog = options.watchdog ?? this.watchdog;
    return this.acquireWith(key, [key], base, options.blockMs, async (token, sent) => {
      const [deadline, refused] = await this.fresh(key, ["LEASE.RENEW", key, owner, ttlMs], 1, sent, ttlMs);
      const lease = new Lease(this, key, owner, token, ttlMs, deadline, watchdog && !refused);
      if (refused) lease.lossSignal.lose("refused");
      return lease;
    });
  }

  /** Takes every key of `keys` or none, under one token (`LEASE.MACQUIRE`);
   * on a cluster they must share one slot (one hash tag). */
  async acquireMany(keys: string[], ttlMs: number, options: Omit<AcquireOptions, "shared" | "limit"> = {}): Promise<MultiLease | null> {
    const ks = checkedKeys(keys, this.target.cluster);
    checkTtl(ttlMs, options.blockMs);
    const label = labelArgs(labelOf(options.label, this.label));
    if (!options._selfWait) this.checkHeld(ks);
    const owner = newOwner();
    const watchdog = options.watchdog ?? this.watchdog;
    const lease = await this.acquireWith(ks[0], ks, macquireArgs(ks, owner, ttlMs, label), options.blockMs, async (token, sent) => {
      const [deadline, refused] = await this.fresh(ks[0], mrenewArgs(ks, owner, ttlMs), ks.length, sent, ttlMs);
      const lease = new MultiLease(this, ks, owner, token, ttlMs, deadline, watchdog && !refused);
      if (refused) lease.lossSignal.lose("refused");
      return lease;
    });
    return lease as MultiLease | null;
  }

  /** A lease granted long after its acquire was sent (a blocking wait) is
   * renewed at once, and its deadline counted from that renewal. */
  private async fresh(key: string, renew: Arg[], count: number, sent: number, ttlMs: number): Promise<[number, boolean]> {
    if (!needsFreshRenewal(sent, ttlMs)) return deadlineAfter(sent, ttlMs, null, null);
    const renewed = now();
    const reply = await this.target.call(key, renew, this.ioTimeoutMs).catch(() => null);
    return deadlineAfter(sent, ttlMs, renewed, reply, count);
  }

  private async acquireWith(
    route: string,
    keys: string[],
    base: Arg[],
    blockMs: number | undefined,
    start: (token: number, sent: number) => Promise<Lease>,
  ): Promise<Lease | null> {
    const waitUntil = blockMs ? now() + blockMs : undefined;
    const attempts = new Attempts(this.retries);
    // A wait starts with one try without BLOCK on the shared connection: a
    // free key costs one round trip and no connection of its own. A
    // newcomer never overtakes a waiter (the server's rule), so this try
    // answers null whenever someone waits, and the wait then queues.
    let quick = blockMs !== undefined;
    for (;;) {
      const [args, timeout] = quick ? [base, this.ioTimeoutMs] : withBlock(base, blockMs, waitUntil, this.ioTimeoutMs, this.blockMarginMs);
      const blocking = args.length > base.length;
      let conn: Dedicated | null = null;
      let reply: unknown;
      const sent = now();
      try {
        if (blocking) {
          conn = await this.target.blocking(route);
          reply = await conn.call(args, timeout);
          conn.done(true);
        } else {
          reply = await this.target.call(route, args, timeout ?? this.ioTimeoutMs);
        }
      } catch (e) {
        conn?.done(false);
        const step = attempts.after(e);
        if (step === null) throw checkStale(e);
        if (step[1]) await this.target.refresh();
        await sleep(step[0]);
        continue;
      }
      if ((reply === null || reply === undefined) && quick) {
        quick = false;
        continue;
      }
      if (reply === null || reply === undefined) {
        const info = await this.target.call(route, ["INFO", "lease"], this.ioTimeoutMs).catch(() => null);
        const grace = info === null ? null : graceOf(info);
        if (grace) throw new LeaseGrace(keys.length === 1 ? keys[0] : keys.join(", "), grace[0], grace[1]);
        return null;
      }
      if (typeof reply !== "number") throw new LeaseError(`unexpected reply to ${String(base[0])}: ${String(reply)}`);
      const lease = await start(reply, sent);
      const ref = new WeakRef(lease);
      for (const k of keys) this.held.set(k, ref);
      return lease;
    }
  }

  /** `acquire`, or LeaseBusy when the lease was not obtained: for `await
   * using lease = await client.lease(...)`. */
  async lease(key: string, ttlMs: number, options: AcquireOptions = {}): Promise<Lease> {
    const lease = await this.acquire(key, ttlMs, options);
    if (!lease) throw new LeaseBusy(`${key} is held by another owner`);
    return lease;
  }

  /** `acquireMany`, or LeaseBusy when the keys were not obtained. */
  async leaseMany(keys: string[], ttlMs: number, options: Omit<AcquireOptions, "shared" | "limit"> = {}): Promise<MultiLease> {
    const lease = await this.acquireMany(keys, ttlMs, options);
    if (!lease) throw new LeaseBusy(`${keys.join(", ")}: some key is held by another owner`);
    return lease;
  }

  /** Runs `work(lease)` holding the lease on `key` (LeaseBusy when it could
   * not be taken), releases it however `work` ends, and returns its result;
   * LeaseLost when `work` ended normally after the lease was lost. */
  async using<T>(key: string, ttlMs: number, options: AcquireOptions, work: (lease: Lease) => Promise<T>): Promise<T> {
    return held(await this.lease(key, ttlMs, options), work);
  }

  /** `using` for several keys at once (all or none, one token). */
  async usingMany<T>(keys: string[], ttlMs: number, options: Omit<AcquireOptions, "shared" | "limit">, work: (lease: MultiLease) => Promise<T>): Promise<T> {
    return held(await this.leaseMany(keys, ttlMs, options), work);
  }
}

/** `work(lease)`, then the release on every way out; LeaseLost when the
 * work ended normally but the lease was refused or expired meanwhile. */
export async function held<L extends { loss: Loss | null; release(): Promise<boolean> }, T>(lease: L, work: (lease: L) => Promise<T>): Promise<T> {
  let result: T;
  try {
    result = await work(lease);
  } catch (e) {
    await lease.release().catch(() => undefined);
    throw e;
  }
  const loss = lease.loss;
  await lease.release();
  if (loss === "refused" || loss === "expired") throw new LeaseLost(loss);
  return result;
}
