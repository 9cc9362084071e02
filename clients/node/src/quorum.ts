// Quorum leases over independent masters with one fencing token (design.md
// S9), the same algorithm as the Rust and Python helpers': LEASE.ACQUIRE on
// every master at once; when a majority granted, the highest token T is
// committed back with LEASE.ACQUIRE ... FLOOR T; held when a majority answers
// exactly T while ttl - drift (from the first send) lasts.

import {
  Arg,
  Commit,
  FenceCall,
  Label,
  LeaseBusy,
  LeaseLost,
  Loss,
  Outlier,
  backoff,
  checkTtl,
  drift,
  fenceArgs,
  fencedReply,
  labelArgs,
  labelOf,
  lossReason,
  newOwner,
  nodeTimeout,
  now,
  quorumOf,
  renewEvery,
  renewOutcome,
  retryPause,
} from "./core.js";
import { RedisClient, Target, targetOf } from "./adapter.js";
import { held } from "./client.js";

export interface QuorumOptions {
  /** How long one master may take to answer one step, ms (5000; at most a
   * third of the ttl is used). */
  ioTimeoutMs?: number;
  /** Renew in the background (true). */
  watchdog?: boolean;
  /** Called for each master an acquisition leaves out because the others
   * refused its token as too far ahead of their clocks (also a warning on
   * `console.warn` unless this is given). */
  onOutlier?: (o: Outlier) => void;
  /** The label of its acquires on every master (`LABEL`), as
   * `ClientOptions.label`: undefined for `defaultLabel()`, null for none. */
  label?: Label;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, Math.max(ms, 0)));

/** Takes quorum leases on the masters of `clients` (one ioredis or
 * node-redis client per master; three or five in practice). */
export class QuorumClient {
  readonly ioTimeoutMs: number;
  readonly watchdog: boolean;
  readonly quorum: number;
  onOutlier: ((o: Outlier) => void) | undefined;
  /** The label of its acquires: a text, or null for none. */
  readonly label: string | Buffer | null;
  /** @internal */
  readonly targets: Target[];

  constructor(clients: Iterable<RedisClient>, options: QuorumOptions = {}) {
    this.targets = [...clients].map(targetOf);
    if (this.targets.length === 0) throw new RangeError("a quorum client needs at least one master");
    this.ioTimeoutMs = options.ioTimeoutMs ?? 5000;
    this.watchdog = options.watchdog ?? true;
    this.onOutlier = options.onOutlier;
    this.label = labelOf(options.label);
    this.quorum = quorumOf(this.targets.length);
  }

  get masters(): number {
    return this.targets.length;
  }

  /** `args(i)` on every master `i` of `on` at once: each reply or the Error. */
  async _each(on: number[], key: string, args: (i: number) => Arg[], timeoutMs: number): Promise<unknown[]> {
    return Promise.all(on.map((i) => this.targets[i].call(key, args(i), timeoutMs).catch((e: unknown) => e)));
  }

  /** As `_each` on every master, resolved as soon as `enough` says so. */
  _eachUntil(key: string, args: Arg[], timeoutMs: number, enough: (r: unknown[]) => boolean): Promise<unknown[]> {
    return new Promise((resolve) => {
      const replies: unknown[] = new Array(this.targets.length).fill(undefined);
      let left = this.targets.length;
      this.targets.forEach((t, i) => {
        void t
          .call(key, args, timeoutMs)
          .catch((e: unknown) => e)
          .then((r) => {
            replies[i] = r;
            left -= 1;
            if (left === 0 || enough(replies)) resolve(replies);
          });
      });
    });
  }

  private all(): number[] {
    return this.targets.map((_, i) => i);
  }

  /** @internal */
  async _releaseEverywhere(key: string, owner: string, timeoutMs: number): Promise<number> {
    const replies = await this._each(this.all(), key, () => ["LEASE.RELEASE", key, owner], timeoutMs);
    return replies.filter((r) => r === 1).length;
  }

  /** Takes the lease on `key` on a majority, with one token: the lease, or
   * null when no majority came within `blockMs` (undefined: one try; 0:
   * until one does), retrying after a random back-off with the same owner. */
  async acquire(
    key: string,
    ttlMs: number,
    options: {
      blockMs?: number;
      watchdog?: boolean;
      label?: Label;
      /** @internal Each attempt's first-round replies, one per master. */
      _replies?: (replies: unknown[]) => void;
    } = {},
  ): Promise<QuorumLease | null> {
    checkTtl(ttlMs, options.blockMs);
    const label = labelArgs(labelOf(options.label, this.label));
    const owner = newOwner();
    const until = options.blockMs === 0 ? null : now() + (options.blockMs ?? 0);
    for (let n = 0; ; n++) {
      const lease = await this.attempt(key, owner, ttlMs, options.watchdog ?? this.watchdog, label, options._replies);
      if (lease) return lease;
      await this._releaseEverywhere(key, owner, nodeTimeout(this.ioTimeoutMs, ttlMs));
      const pause = backoff(ttlMs);
      if (until !== null && now() + pause >= until) return null;
      await sleep(pause);
    }
  }

  private async attempt(key: string, owner: string, ttlMs: number, watchdog: boolean, label: Arg[], onReplies?: (replies: unknown[]) => void): Promise<QuorumLease | null> {
    const timeout = nodeTimeout(this.ioTimeoutMs, ttlMs);
    const t0 = now();
    const validUntil = t0 + ttlMs - drift(ttlMs);
    const first = await this._each(this.all(), key, () => ["LEASE.ACQUIRE", key, owner, ttlMs, ...label], timeout);
    // The first round's replies, one per master (the Redlock drop-ins' votes).
    onReplies?.(first);
    let commit = Commit.first(first, this.quorum);
    if (!commit) return null;
    let committed: number[] | null = null;
    // At most one round per master: each leaves one out.
    for (let round = 0; round <= this.targets.length; round++) {
      const token = commit.token;
      const settled: number[] | [Commit, Outlier[]] | null = commit.settle(
        await this._each(commit.on, key, () => ["LEASE.ACQUIRE", key, owner, ttlMs, ...label, "FLOOR", token], timeout),
        (i) => this.targets[i].addr(),
      );
      if (settled === null || typeof settled[0] === "number") {
        committed = settled as number[] | null;
        break;
      }
      const [next, outliers] = settled as [Commit, Outlier[]];
      commit = next;
      for (const o of outliers) {
        if (this.onOutlier) this.onOutlier(o);
        else console.warn(`redis-lease: quorum master ${o.master} (${o.addr}) left out: its token is ${o.aheadMs} ms of clock ahead of what the others accept; its clock is wrong`);
      }
    }
    if (!committed || now() >= validUntil) return null;
    return new QuorumLease(this, key, owner, commit.token, ttlMs, validUntil, committed, watchdog);
  }

  /** `acquire`, or LeaseBusy when no majority granted. */
  async lease(key: string, ttlMs: number, options: { blockMs?: number; label?: Label } = {}): Promise<QuorumLease> {
    const lease = await this.acquire(key, ttlMs, options);
    if (!lease) throw new LeaseBusy(`${key}: no majority of the masters granted the lease`);
    return lease;
  }

  /** Runs `work(lease)` holding the quorum lease, releases it however it
   * ends; LeaseLost when it ended normally after the lease was lost. */
  async using<T>(key: string, ttlMs: number, options: { blockMs?: number; label?: Label }, work: (lease: QuorumLease) => Promise<T>): Promise<T> {
    return held(await this.lease(key, ttlMs, options), work);
  }

  /** Closes the helper's own connections (not the clients you passed). */
  async close(): Promise<void> {
    await Promise.all(this.targets.map((t) => t.close()));
  }
}

/** A quorum lease: one `token` committed on a majority (`committed`: the
 * masters' indexes), `signal` aborted when lost or released. */
export class QuorumLease {
  readonly signal: AbortSignal;
  private readonly controller = new AbortController();
  private validUntil: number;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private released = false;
  private watched: boolean;
  private until: number | null = null;
  private round: ReturnType<typeof setTimeout> | undefined;

  /** @internal */
  constructor(
    private readonly client: QuorumClient,
    readonly key: string,
    private readonly owner: string,
    readonly token: number,
    readonly ttlMs: number,
    validUntil: number,
    readonly committed: number[],
    watchdog: boolean,
  ) {
    this.signal = this.controller.signal;
    this.validUntil = validUntil;
    this.armExpiry();
    this.watched = watchdog;
    if (watchdog) this.schedule(validUntil + drift(ttlMs) - ttlMs + renewEvery(ttlMs) - now());
  }

  /** @internal Renewed in the background (its ttl each time) until `until`
   * (performance.now() ms; null: for as long as it is held), the last
   * renewal asking only for the time left: a lock longer than the masters'
   * `lease.max-ttl-ms`. Just renewed (or acquired). */
  _renewUntil(until: number | null): void {
    if (this.released || this.lost) return;
    this.until = until;
    if (until !== null && until <= this.validUntil + drift(this.ttlMs) && !this.watched) return;
    this.watched = true;
    this.schedule(renewEvery(this.ttlMs));
  }

  private armExpiry(): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.checkExpiry(), Math.max(this.validUntil - now(), 0) + 1);
    this.timer.unref?.();
  }

  private checkExpiry(): void {
    if (this.signal.aborted) return;
    if (now() >= this.validUntil) this.lose("expired");
    else this.armExpiry();
  }

  private lose(loss: Loss): void {
    clearTimeout(this.timer);
    if (!this.signal.aborted) this.controller.abort(lossReason(loss));
  }

  private schedule(ms: number): void {
    clearTimeout(this.round);
    this.round = setTimeout(() => void this.watchdogRound(), Math.max(ms, 1));
    this.round.unref?.();
  }

  private async watchdogRound(): Promise<void> {
    if (this.lost) return;
    const ttl = this.until === null ? this.ttlMs : Math.min(this.ttlMs, Math.ceil(this.until - now()));
    if (ttl < 1) return; // ends at `until` by itself
    const outcome = await this.renewRound(ttl);
    if (outcome === false || this.lost) return;
    // The last renewal of a lease watched until an end: none after it.
    if (outcome && ttl < this.ttlMs) return;
    this.schedule(outcome ? renewEvery(this.ttlMs) : retryPause(this.ttlMs));
  }

  /** @internal The owner id (the holder's credential: never logged). */
  get _owner(): string {
    return this.owner;
  }

  get lost(): boolean {
    this.checkExpiry();
    return this.signal.aborted;
  }

  get loss(): Loss | null {
    this.checkExpiry();
    const r: unknown = this.signal.reason;
    return this.signal.aborted && r instanceof LeaseLost ? r.loss : null;
  }

  /** Until when it is valid (performance.now() ms). */
  get deadline(): number {
    return this.validUntil;
  }

  private async renewRound(ttlMs = this.ttlMs): Promise<boolean | null> {
    const c = this.client;
    const sent = now();
    const n = c.masters;
    const replies = await c._eachUntil(this.key, ["LEASE.RENEW", this.key, this.owner, ttlMs], nodeTimeout(c.ioTimeoutMs, ttlMs), (r) => renewOutcome(r, n) !== null);
    const outcome = renewOutcome(replies, n);
    if (outcome === true && !this.signal.aborted) {
      this.validUntil = Math.max(this.validUntil, sent + ttlMs - drift(ttlMs));
      this.armExpiry();
    } else if (outcome === false) this.lose("refused");
    return outcome;
  }

  /** Renews on every master now (for `ttlMs`, the lease's ttl unless
   * given): true when a majority renewed. */
  async renew(ttlMs: number = this.ttlMs): Promise<boolean> {
    if (this.lost) return false;
    return (await this.renewRound(ttlMs)) === true;
  }

  /** `LEASE.FENCE key token [MINTTL ms] command...` on the masters that
   * committed the token: the first reply of a master that ran it, or
   * StaleToken when the token was current on fewer than a majority. With
   * `fence({ minTtlMs }, ...command)`, a master where the lease has less
   * left runs nothing, and LeaseExpiring is thrown when the token was
   * current on a majority but too few of them had the time. */
  async fence(...call: FenceCall): Promise<unknown> {
    const c = this.client;
    const args = fenceArgs(this.key, this.token, call);
    return fencedReply(await c._each(this.committed, this.key, () => args, c.ioTimeoutMs), c.quorum);
  }

  /** Gives the lease back on every master: true when a majority released. */
  async release(): Promise<boolean> {
    const replies = await this._release();
    return replies !== null && replies.filter((r) => r === 1).length >= this.client.quorum;
  }

  /** @internal The release on every master: each reply or Error (null:
   * released before, nothing sent). */
  async _release(): Promise<unknown[] | null> {
    if (this.released) return null;
    this.released = true;
    clearTimeout(this.round);
    this.lose("released");
    const c = this.client;
    return c._each(c.targets.map((_, i) => i), this.key, () => ["LEASE.RELEASE", this.key, this.owner], nodeTimeout(c.ioTimeoutMs, this.ttlMs));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }
}
