// Quorum leases over independent masters with one fencing token (design.md
// S9), the same algorithm as the Rust and Python helpers': step 1 sends
// LEASE.ACQUIRE ... FLOOR P to every master at once, P a token proposed from
// this client's clock plus an offset learned from the masters' answers; the
// lease is held with P when a majority answers exactly P while ttl - drift
// (from the first send) lasts: one round trip. Otherwise, when a majority
// granted, the highest token T is committed back with LEASE.ACQUIRE ...
// FLOOR T (step 3). Every step (acquire, commit round, renewal, release) is
// decided as soon as a majority decides it. A step held in one round trip,
// a renewal and a release then return at once, as node-redlock's do (the
// rest are read in the background: a late answer of P joins `committed`);
// a step 3, and a step 1 that leads to it or fails, waits for the rest as
// long again as it took (25 ms at least), as every step of the Rust and
// Python helpers. A master's next command waits for its calls still out
// unless they went down the same open connection, which the server reads in
// order: a release never overtakes the acquire it releases. The decisions
// are core.ts's; this file does the I/O.

import {
  Arg,
  Commit,
  FAILED,
  FenceCall,
  Held,
  Label,
  LeaseBusy,
  Loss,
  NOT_IN,
  Outlier,
  Proposer,
  ReplyTimeout,
  backoff,
  checkTtl,
  drift,
  fastOutliers,
  fenceArgs,
  fencedReply,
  firstOutcome,
  floorRefused,
  labelArgs,
  labelOf,
  linger,
  lossReason,
  newOwner,
  nodeTimeout,
  now,
  quorumOf,
  releaseOutcome,
  renewEvery,
  renewOutcome,
  retryPause,
  timedOut,
} from "./core.js";
import { RedisClient, Target, targetOf } from "./adapter.js";
import { held } from "./client.js";

export interface QuorumOptions {
  /** How long one master may take to answer one step, ms (5000; at most a
   * third of the ttl is used). */
  ioTimeoutMs?: number;
  /** Renew in the background (true). */
  watchdog?: boolean;
  /** Called for each master an acquisition leaves out because its clock
   * runs far ahead (see `Outlier`; also a warning on `console.warn` unless
   * this is given). */
  onOutlier?: (o: Outlier) => void;
  /** The label of its acquires on every master (`LABEL`), as
   * `ClientOptions.label`: undefined for `defaultLabel()`, null for none. */
  label?: Label;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, Math.max(ms, 0)));

/** After this long without a step, the masters' connections are looked at
 * after a turn of the event loop (ms; the Rust helper's idle check: 100). */
const IDLE_MS = 100;

/** A call to a master that outlived its step: `over` once it is. */
interface Gate {
  readonly via: object | null;
  readonly over: Promise<void>;
  open(): void;
}

const errorOf = (e: unknown): unknown => e;

/** How a step stands, from its replies in so far: not decided; decided,
 * the caller resuming after the linger (the masters about as fast as the
 * majority count in the replies it gets); decided, the caller resuming at
 * once, the rest read in the background (given to the step's `all`). */
export const UNDECIDED = 0;
export const LINGER = 1;
export const NOW = 2;
type Decision = typeof UNDECIDED | typeof LINGER | typeof NOW;

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
  /** @internal This client's wall clock moved by this many ms (0 but in the
   * tests that play a client whose clock is wrong). */
  _clockOffsetMs = 0;
  private readonly proposer = new Proposer();
  private readonly everyMaster: number[];
  /** The calls to each master that outlived their step, not over yet. */
  private readonly late: Set<Gate>[];
  /** When this client last sent a step (performance.now() ms). */
  private lastSent = -Infinity;

  constructor(clients: Iterable<RedisClient>, options: QuorumOptions = {}) {
    this.targets = [...clients].map(targetOf);
    if (this.targets.length === 0) throw new RangeError("a quorum client needs at least one master");
    this.ioTimeoutMs = options.ioTimeoutMs ?? 5000;
    this.watchdog = options.watchdog ?? true;
    this.onOutlier = options.onOutlier;
    this.label = labelOf(options.label);
    this.quorum = quorumOf(this.targets.length);
    this.late = this.targets.map(() => new Set());
    this.everyMaster = this.targets.map((_, i) => i);
  }

  get masters(): number {
    return this.targets.length;
  }

  /** `args(i)` on every master `i` of `on` at once: each reply or the Error
   * (a ReplyTimeout for a master not in within `timeoutMs`). */
  async _each(on: number[], key: string, args: (i: number) => Arg[], timeoutMs: number): Promise<unknown[]> {
    return timedOut(await this._eachUntil(on, key, args, timeoutMs, () => false));
  }

  /** `args(i)` on every master `i` of `on` at once (`retry(i)`, when given,
   * sent at once to a master that refused the first as a FLOOR too far
   * ahead of its clock): the replies in (`NOT_IN`: not in), once every
   * master answered, or `timeoutMs` passed, or `decided` says so of the
   * replies in (`NOW`: then; `LINGER`: after the linger). The calls still
   * out go on (each bounded by `timeoutMs`); the next call to their master
   * waits for them. `all`, when given, gets every reply (or the Error, a
   * ReplyTimeout past `timeoutMs`) once every call is over. */
  _eachUntil(
    on: number[],
    key: string,
    args: (i: number) => Arg[],
    timeoutMs: number,
    decided: (replies: unknown[]) => Decision | boolean,
    retry?: (i: number) => Arg[],
    all?: (replies: unknown[]) => void,
  ): Promise<unknown[]> {
    const start = now();
    const end = start + Math.max(timeoutMs, 1);
    const count = on.length;
    const replies: unknown[] = new Array<unknown>(count).fill(NOT_IN);
    // Each call is over when its reply is in or the step's end passed (one
    // timer for the step); `gates[n]`: the next call to its master waits
    // for it to be over.
    const over: boolean[] = new Array<boolean>(count).fill(false);
    const gates: (Gate | null)[] = new Array<Gate | null>(count).fill(null);
    // The connection each call was written to (null: not known).
    const via: (object | null)[] = new Array<object | null>(count).fill(null);
    return new Promise((resolve) => {
      let left = count;
      let resumed = false;
      let settled = false;
      let lingering: ReturnType<typeof setTimeout> | undefined;
      let expiry: ReturnType<typeof setTimeout> | undefined;
      const finish = (): void => {
        if (resumed) return;
        resumed = true;
        clearTimeout(lingering);
        for (let n = 0; n < count; n++) if (!over[n]) gates[n] = this.gate(on[n], via[n]);
        resolve(replies.slice());
      };
      const got = (n: number, r: unknown): void => {
        if (over[n]) return;
        over[n] = true;
        replies[n] = r;
        gates[n]?.open();
        left -= 1;
        if (left === 0) {
          clearTimeout(expiry);
          finish();
          all?.(replies);
        } else if (!resumed && !settled) {
          const d = decided(replies);
          if (d === NOW) finish();
          else if (d) lingering = setTimeout(finish, Math.min(linger(now() - start), end - now()));
          settled = d !== UNDECIDED && d !== false;
        }
      };
      for (let n = 0; n < count; n++) {
        const i = on[n];
        void this.callOne(i, key, args(i), retry?.(i), via, n).then((r) => got(n, r));
      }
      if (count === 0) {
        finish();
        all?.(replies);
      } else if (left > 0) {
        expiry = setTimeout(() => {
          for (let n = 0; n < count; n++) if (!over[n]) got(n, new ReplyTimeout(`no reply within ${Math.round(end - start)} ms`));
        }, end - start);
      }
    });
  }

  /** `args` on master `i` (then `retry` when it refused a FLOOR as too far
   * ahead): the reply or the Error, unbounded (its step bounds it); the
   * connection it was written to in `via[n]`. After the calls to this
   * master that outlived their step (each over by its step's end), unless
   * they were all written to the connection this one goes to, which the
   * server reads in order: a release never overtakes the acquire it
   * releases. */
  private callOne(i: number, key: string, args: Arg[], retry: Arg[] | undefined, via: (object | null)[], n: number): Promise<unknown> {
    this.lastSent = now();
    const before = this.late[i];
    if (before.size === 0 || this.inOrder(i, before)) return this.send(i, key, args, retry, via, n);
    const wait = before.size === 1 ? before.values().next().value!.over : Promise.all([...before].map((g) => g.over));
    return wait.then(() => this.send(i, key, args, retry, via, n));
  }

  /** Every call of `before` was written to the open connection a call to
   * master `i` is written to now. */
  private inOrder(i: number, before: Set<Gate>): boolean {
    const s = this.targets[i].stream();
    if (s === null) return false;
    for (const g of before) if (g.via !== s) return false;
    return true;
  }

  private send(i: number, key: string, args: Arg[], retry: Arg[] | undefined, via: (object | null)[], n: number): Promise<unknown> {
    const t = this.targets[i];
    via[n] = t.stream();
    const sent = t.call(key, args, null);
    if (!retry) return sent.catch(errorOf);
    return sent.then(
      (r) => r,
      (e: unknown) => {
        if (!floorRefused(e)) return e;
        if (t.stream() !== via[n]) via[n] = null;
        return t.call(key, retry, null).catch(errorOf);
      },
    );
  }

  /** A gate on master `i` for a call written to `via`: its next calls wait
   * until it is open (unless written to that same connection). */
  private gate(i: number, via: object | null): Gate {
    const gates = this.late[i];
    let open: () => void = () => {};
    const over = new Promise<void>((resolve) => (open = resolve));
    const g: Gate = {
      via,
      over,
      open: () => {
        gates.delete(g);
        open();
      },
    };
    gates.add(g);
    return g;
  }

  /** Before step 1: when the connections of too many masters are down (the
   * servers closed them: a restart, `CLIENT KILL`, an idle `timeout`; the
   * libraries reopen them), waits until a majority is ready again, at most
   * `ms`, so that the proposal is read from the clock when it can be sent,
   * not before a reconnect that would make it miss. One look at each
   * client, no round trip, when they are up. */
  private majorityReady(ms: number): Promise<void> | null {
    // A master idle for a while: one turn of the event loop's I/O first,
    // so that a close the server sent meanwhile is seen before the look.
    if (now() - this.lastSent >= IDLE_MS) return new Promise<void>((resolve) => setImmediate(() => setImmediate(resolve))).then(() => this.readyLook(ms) ?? undefined);
    return this.readyLook(ms);
  }

  /** null: a majority is ready. */
  private readyLook(ms: number): Promise<void> | null {
    let ready = 0;
    for (const t of this.targets) if (t.ready()) ready++;
    if (ready >= this.quorum) return null;
    return new Promise<void>((resolve) => {
      let waiting = this.targets.length - ready;
      for (const t of this.targets) {
        if (t.ready()) continue;
        void t.whenReady(ms).then(() => {
          if (t.ready()) ready += 1;
          waiting -= 1;
          if (ready >= this.quorum || waiting === 0) resolve();
        });
      }
    });
  }

  /** Every master's index (shared: never changed). */
  private all(): number[] {
    return this.everyMaster;
  }

  /** @internal `LEASE.RELEASE` everywhere, done as soon as a majority
   * decided it (the masters not in yet still get it, read in the
   * background): each reply, `NOT_IN` for a master not in then, or Error;
   * `all` gets every reply once every call is over. */
  _releaseEverywhere(key: string, owner: string, timeoutMs: number, all?: (replies: unknown[]) => void): Promise<unknown[]> {
    const n = this.masters;
    const args: Arg[] = ["LEASE.RELEASE", key, owner];
    return this._eachUntil(this.all(), key, () => args, timeoutMs, (r) => (releaseOutcome(r, n) === null ? UNDECIDED : NOW), undefined, all);
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
      /** @internal Each attempt's step-1 replies, one per master, as the
       * step was decided (`NOT_IN`: not in then), and a promise of all of
       * them once every call is over (a ReplyTimeout for one past the
       * step's timeout): the Redlock drop-ins' votes. */
      _replies?: (replies: unknown[], all: Promise<unknown[]>) => void;
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

  private report(outliers: Outlier[]): void {
    for (const o of outliers) {
      if (this.onOutlier) this.onOutlier(o);
      else console.warn(`redis-lease: quorum master ${o.master} (${o.addr}) left out: its token is ${o.aheadMs} ms of clock ahead of what the others accept; its clock is wrong`);
    }
  }

  private async attempt(key: string, owner: string, ttlMs: number, watchdog: boolean, label: Arg[], onReplies?: (replies: unknown[], all: Promise<unknown[]>) => void): Promise<QuorumLease | null> {
    const timeout = nodeTimeout(this.ioTimeoutMs, ttlMs);
    const t0 = now();
    const validUntil = t0 + ttlMs - drift(ttlMs);
    const all = this.all();
    const addr = (i: number): string => this.targets[i].addr();
    const acquire: Arg[] = ["LEASE.ACQUIRE", key, owner, ttlMs, ...label];
    const waiting = this.majorityReady(timeout);
    if (waiting) await waiting;
    // Step 1 proposes the token.
    const sentMs = Date.now() + this._clockOffsetMs;
    const p = this.proposer.propose(sentMs, Math.floor(Math.random() * 65536));
    const proposed = [...acquire, "FLOOR", p];
    // Held in one round trip: the caller resumes at once, and the masters
    // that answer `p` later join `committed` as their replies come.
    let lateReplies: (replies: unknown[]) => void = () => {};
    const everyReply = new Promise<unknown[]>((resolve) => (lateReplies = resolve));
    const replies = await this._eachUntil(
      all,
      key,
      () => proposed,
      timeout,
      (r) => {
        const o = firstOutcome(p, all, r, this.quorum);
        return o === null ? UNDECIDED : o instanceof Held ? NOW : LINGER;
      },
      () => acquire,
      lateReplies,
    );
    this.proposer.learn(sentMs, p, replies);
    onReplies?.(replies, everyReply);
    // Held as the step was decided; else decided on the replies after the
    // linger, a master not in counting as timed out.
    const fast = firstOutcome(p, all, replies, this.quorum);
    const first = fast instanceof Held ? replies : timedOut(replies);
    const outcome = fast instanceof Held ? fast : firstOutcome(p, all, first, this.quorum);
    let token: number;
    let committed: number[] | null = null;
    const out = new Set<number>();
    if (outcome instanceof Held) {
      const on = outcome.on;
      [token, committed] = [outcome.token, on];
      this.report(fastOutliers(p, all, replies, addr));
      for (let n = 0; n < all.length; n++) if (replies[n] === NOT_IN) out.add(all[n]);
      if (out.size > 0)
        void everyReply.then((every) => {
          const late = every.map((r, n) => (replies[n] === NOT_IN ? r : NOT_IN));
          for (let n = 0; n < late.length; n++) {
            if (late[n] === p) on.push(all[n]);
            out.delete(all[n]);
          }
          this.report(fastOutliers(p, all, late, addr));
        });
    } else if (outcome instanceof Commit) {
      // Step 3, at most one round per master: each leaves one out.
      let commit = outcome;
      for (let round = 0; round <= this.targets.length && !committed; round++) {
        const c = commit;
        const args = [...acquire, "FLOOR", c.token];
        const got = timedOut(await this._eachUntil(c.on, key, () => args, timeout, (r) => c.decide(r, String) !== null));
        const decided = c.decide(got, addr);
        if (decided === FAILED || decided === null) return null;
        if (typeof decided[0] === "number") committed = decided as number[];
        else {
          const [next, outliers] = decided as [Commit, Outlier[]];
          this.report(outliers);
          commit = next;
        }
      }
      token = commit.token;
    } else return null;
    if (!committed || now() >= validUntil) return null;
    return new QuorumLease(this, key, owner, token, ttlMs, validUntil, committed, watchdog, out);
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
 * masters' indexes; a master whose answer came after the acquire returned
 * joins it then), `signal` aborted when lost or released. */
export class QuorumLease {
  /** Made when `signal` is first asked for: until then no timer watches
   * the expiry (`lost` looks at the clock). */
  private controller: AbortController | null = null;
  private lostAs: Loss | null = null;
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
    /** The masters whose step-1 answer was not in yet (they join
     * `committed` when it comes, if they answered the token). */
    private readonly out: Set<number> = new Set(),
  ) {
    this.validUntil = validUntil;
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

  /** Aborted when lost or released. */
  get signal(): AbortSignal {
    if (!this.controller) {
      this.controller = new AbortController();
      if (this.expired()) this.controller.abort(lossReason(this.lostAs!));
      else this.armExpiry();
    }
    return this.controller.signal;
  }

  /** The expiry timer, while someone holds the signal. */
  private armExpiry(): void {
    if (!this.controller) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      if (!this.expired()) this.armExpiry();
    }, Math.max(this.validUntil - now(), 0) + 1);
    this.timer.unref?.();
  }

  /** Lost (now, when its validity just ran out)? */
  private expired(): boolean {
    if (this.lostAs === null && now() >= this.validUntil) this.lose("expired");
    return this.lostAs !== null;
  }

  private lose(loss: Loss): void {
    clearTimeout(this.timer);
    if (this.lostAs !== null) return;
    this.lostAs = loss;
    this.controller?.abort(lossReason(loss));
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
    return this.expired();
  }

  get loss(): Loss | null {
    this.expired();
    return this.lostAs;
  }

  /** Until when it is valid (performance.now() ms). */
  get deadline(): number {
    return this.validUntil;
  }

  private async renewRound(ttlMs = this.ttlMs): Promise<boolean | null> {
    const c = this.client;
    const sent = now();
    const n = c.masters;
    const args = ["LEASE.RENEW", this.key, this.owner, ttlMs];
    const all = c.targets.map((_, i) => i);
    // Done as soon as a majority decided it; the rest are read in the
    // background.
    const replies = await c._eachUntil(all, this.key, () => args, nodeTimeout(c.ioTimeoutMs, ttlMs), (r) => (renewOutcome(r, n) === null ? UNDECIDED : NOW));
    const outcome = renewOutcome(replies, n);
    if (outcome === true && this.lostAs === null) {
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
    // Also on the masters whose step-1 answer is still out: the fence goes
    // after their acquire, and runs there only if they hold the token.
    const on = this.out.size === 0 ? this.committed : [...this.committed, ...this.out];
    return fencedReply(await c._each(on, this.key, () => args, c.ioTimeoutMs), c.quorum);
  }

  /** Gives the lease back on every master: true when a majority released. */
  async release(): Promise<boolean> {
    const replies = await this._release();
    return replies !== null && releaseOutcome(replies, this.client.masters) === true;
  }

  /** @internal The release on every master, done as soon as a majority
   * decided it: each reply, `NOT_IN` for a master not in then (it still
   * gets it), or Error; `all` gets every reply once every call is over;
   * null: released before, nothing sent. */
  async _release(all?: (replies: unknown[]) => void): Promise<unknown[] | null> {
    if (this.released) return null;
    this.released = true;
    clearTimeout(this.round);
    this.lose("released");
    const c = this.client;
    return c._releaseEverywhere(this.key, this.owner, nodeTimeout(c.ioTimeoutMs, this.ttlMs), all);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }
}
