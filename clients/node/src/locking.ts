// The engine of the node-redlock drop-ins (redlock.ts for v5, redlock-v4.ts
// for v4): acquire, extend and release a lock on one server (LEASE.ACQUIRE,
// or LEASE.MACQUIRE for several resources) or on several independent
// masters (one quorum lease per resource, design.md S9), and say how each
// client voted on each try. The two drop-ins only shape the votes as their
// node-redlock version reports them.
//
// Any duration: the server lease is at most the server's `lease.max-ttl-ms`
// long (learnt from its refusal of a longer ttl), renewed by the watchdog
// until the lock's end; a holder that dies frees the lock within one lease.

import { Arg, FenceCall, Label, LeaseError, NOT_IN, drift, fenceArgs, isReplyError, now } from "./core.js";
import { RedisClient, Target } from "./adapter.js";
import { Lease, LeaseClient } from "./client.js";
import { QuorumClient, QuorumLease } from "./quorum.js";

export type Client = RedisClient;

/** A vote against: the resource is held by another lock ("locked"), the
 * name is a key of another type ("wrongtype": an old node-redlock lock's
 * string during a rolling switch, say), or the client failed ("error": an
 * unreachable server, an error reply). */
export type Against = { kind: "locked" } | { kind: "wrongtype"; error: Error } | { kind: "error"; error: Error };

/** How every client voted (a missing client voted for): the votes in when
 * the outcome was decided, and the later ones added to `against` as they
 * come, `settled` once every vote is in (node-redlock's `stats`). */
export interface Votes {
  readonly against: Map<Client, Against>;
  readonly settled: Promise<void>;
}

/** How every client voted on one try. */
export interface Try extends Votes {
  /** This try waited on the server (`BLOCK`) for the rest of the window. */
  readonly waited: boolean;
}

/** Every vote in. */
export const ALL_IN: Promise<void> = Promise.resolve();

export type Held = { kind: "one"; lease: Lease } | { kind: "quorum"; leases: QuorumLease[] };

export interface Retry {
  /** -1: for ever. */
  readonly retryCount: number;
  readonly retryDelay: number;
  readonly retryJitter: number;
}

export interface Acquired {
  readonly held: Held | null;
  readonly tries: Try[];
  /** The ms spent waiting on the server. */
  readonly waitedMs: number;
  /** Date.now() when the lock was granted (its server lease counts from
   * there); when the acquire started, if it failed. */
  readonly start: number;
}

const OUT_OF_RANGE = /ttl-ms is out of range \(must be 1\.\.(\d+)\)/;

/** The server's `lease.max-ttl-ms` from its refusal of a longer ttl. */
export function maxTtlOf(e: unknown): number | null {
  const m = isReplyError(e) ? OUT_OF_RANGE.exec(e.message) : null;
  return m ? Number(m[1]) : null;
}

/** A `WRONGTYPE` reply: the name is a key of another type. */
export function wrongType(e: unknown): boolean {
  return isReplyError(e) && e.message.startsWith("WRONGTYPE");
}

function againstOf(e: unknown): Against {
  const error = e instanceof Error ? e : new Error(String(e));
  return wrongType(e) ? { kind: "wrongtype", error } : { kind: "error", error };
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, Math.max(ms, 0)));
const sortedUnique = (xs: string[]): string[] => [...new Set(xs)].sort();

/** The pause before another try: node-redlock's `retryDelay ± retryJitter`. */
export function retryPauseOf(r: Retry): number {
  return Math.max(0, r.retryDelay + Math.floor((Math.random() * 2 - 1) * r.retryJitter));
}

export class Locker {
  readonly clients: Client[];
  readonly one: LeaseClient | null;
  readonly quorum: QuorumClient | null;
  /** The smallest `lease.max-ttl-ms` the servers told (null: none yet). */
  private maxTtlMs: number | null = null;
  /** The locks renewed until an end, kept until then (or their release):
   * a node-redlock lock holds its key until it expires even when the Lock
   * object is dropped, and a lease nobody references stops being renewed. */
  private readonly kept = new Map<Held, ReturnType<typeof setTimeout> | null>();

  constructor(clients: Client[], label: Label | undefined, onOutlier: (message: string) => void) {
    this.clients = clients;
    if (clients.length === 1) {
      this.one = new LeaseClient(clients[0], { watchdog: false, label });
      this.quorum = null;
    } else {
      this.one = null;
      this.quorum = new QuorumClient(clients, {
        watchdog: false,
        label,
        onOutlier: (o) => onOutlier(`quorum master ${o.addr} left out: its clock is ${o.aheadMs} ms ahead`),
      });
    }
  }

  get quorumSize(): number {
    return Math.floor(this.clients.length / 2) + 1;
  }

  /** The server lease of a lock of `duration` ms. */
  ttlFor(duration: number): number {
    return this.maxTtlMs === null ? duration : Math.min(duration, this.maxTtlMs);
  }

  /** Learns the servers' `lease.max-ttl-ms` from a refusal: true when `e`
   * was one (try again, shorter). */
  private learn(e: unknown): boolean {
    const cap = maxTtlOf(e);
    if (cap === null) return false;
    this.maxTtlMs = this.maxTtlMs === null ? cap : Math.min(this.maxTtlMs, cap);
    return true;
  }

  async close(): Promise<void> {
    await (this.one ?? this.quorum)!.close();
  }

  /** Locks `resources` for `duration` ms (`forever`: until released,
   * renewed in the background; for `using`). One master: a try, then a wait on the
   * server (in arrival order) for the rest of the retry window
   * (`retryCount x retryDelay`) when the resources are held; several: a try
   * every `retryDelay` as node-redlock. A failed try (an error, a key of
   * another type) is tried again every `retryDelay`, `retryCount` times. */
  async acquire(resources: string[], duration: number, forever: boolean, retry: Retry, label: Label | undefined): Promise<Acquired> {
    const t0 = now();
    const window = retry.retryCount === -1 ? Infinity : retry.retryCount * retry.retryDelay;
    const maxTries = retry.retryCount === -1 ? Infinity : retry.retryCount + 1;
    const tries: Try[] = [];
    let waitedMs = 0;
    let held: Held | null = null;
    let start = Date.now();
    for (let n = 1; n < 1e9; n++) {
      let [h, t] = await this.tryOnce(resources, duration, undefined, label);
      tries.push(t);
      if (!h && this.one && window > 0 && allLocked(t)) {
        const left = window === Infinity ? 0 : Math.ceil(t0 + window - now());
        if (window === Infinity || left >= 1) {
          const w0 = now();
          [h, t] = await this.tryOnce(resources, duration, left, label);
          waitedMs += now() - w0;
          tries.push({ ...t, waited: true });
          if (!h && allLocked(t)) break; // the wait ran out
        }
      }
      if (h) {
        held = h;
        // The lock counts from its grant (after a wait on the server: the
        // renewal that followed it), as node-redlock's from its last try.
        const granted = grantedAt(h);
        start = Date.now() - (now() - granted);
        this.watch(h, forever ? null : granted + duration, duration);
        break;
      }
      if (n >= maxTries) break;
      await sleep(retryPauseOf(retry));
    }
    return { held, tries, waitedMs, start };
  }

  /** Renewed until `until` when the lock outlasts its server lease (or
   * until released, `null`). */
  private watch(h: Held, until: number | null, duration: number): void {
    if (h.kind === "one") h.lease._renewUntil(until, this.ttlFor(duration));
    else for (const l of h.leases) l._renewUntil(until);
    this.unkeep(h);
    if (until !== null && duration > this.ttlFor(duration)) {
      // Past 2^31 - 1 ms a timer fires at once: kept until released then.
      const left = until - now();
      const timer = left < 2 ** 31 - 1 ? setTimeout(() => this.kept.delete(h), left) : null;
      timer?.unref?.();
      this.kept.set(h, timer);
    }
  }

  private unkeep(h: Held): void {
    if (!this.kept.has(h)) return;
    clearTimeout(this.kept.get(h) ?? undefined);
    this.kept.delete(h);
  }

  private async tryOnce(resources: string[], duration: number, blockMs: number | undefined, label: Label | undefined): Promise<[Held | null, Try]> {
    if (this.one) {
      const one = this.one;
      const client = this.clients[0];
      for (let k = 0; k < 3; k++) {
        const ttl = this.ttlFor(duration);
        try {
          const options = { blockMs, watchdog: false, label, _selfWait: true };
          const lease = resources.length === 1 ? await one.acquire(resources[0], ttl, options) : await one.acquireMany(resources, ttl, options);
          if (lease) return [{ kind: "one", lease }, { against: new Map(), settled: ALL_IN, waited: false }];
          return [null, { against: new Map([[client, { kind: "locked" }]]), settled: ALL_IN, waited: false }];
        } catch (e) {
          if (this.learn(e)) continue;
          return [null, { against: new Map([[client, againstOf(e)]]), settled: ALL_IN, waited: false }];
        }
      }
      return [null, { against: new Map([[client, { kind: "error", error: new LeaseError("the server refused every lease length") }]]), settled: ALL_IN, waited: false }];
    }
    const quorum = this.quorum!;
    const against = new Map<Client, Against>();
    const leases: QuorumLease[] = [];
    const late: Promise<void>[] = [];
    let failed = false;
    // In sorted order, all or none: no deadlock between two multi-resource locks.
    for (const r of sortedUnique(resources)) {
      let lease: QuorumLease | null = null;
      let replies: unknown[] = [];
      let every: Promise<unknown[]> | null = null;
      for (let k = 0; k < 3; k++) {
        replies = [];
        lease = await quorum.acquire(r, this.ttlFor(duration), {
          watchdog: false,
          label,
          _replies: (x, all) => {
            replies = x;
            every = all;
          },
        });
        if (lease || !replies.some((x) => this.learn(x))) break;
      }
      this.acquireVotes(against, replies);
      // The votes not in when the step was decided, as they come.
      const pending = replies;
      if (every && pending.includes(NOT_IN)) late.push((every as Promise<unknown[]>).then((all) => this.acquireVotes(against, all.map((x, i) => (pending[i] === NOT_IN ? x : NOT_IN)))));
      if (!lease) {
        failed = true;
        break;
      }
      leases.push(lease);
    }
    const settled = late.length === 0 ? ALL_IN : Promise.all(late).then(() => undefined);
    if (failed) {
      await Promise.all(leases.map((l) => l.release().catch(() => false)));
      // A majority granted every resource but the commit failed: not held.
      const notHeld = (): void => {
        if (this.clients.length - against.size >= this.quorumSize) for (const c of this.clients) if (!against.has(c)) against.set(c, { kind: "locked" });
      };
      return [null, { against, settled: settled.then(notHeld), waited: false }];
    }
    const byResource = resources.map((r) => leases.find((l) => l.key === r)!);
    return [{ kind: "quorum", leases: byResource }, { against, settled, waited: false }];
  }

  /** Step 1's replies (`NOT_IN`: not a vote yet) as votes against. */
  private acquireVotes(against: Map<Client, Against>, replies: unknown[]): void {
    replies.forEach((x, i) => {
      const c = this.clients[i];
      if (x === NOT_IN || against.has(c)) return;
      if (x === null || x === undefined) against.set(c, { kind: "locked" });
      else if (x instanceof Error) against.set(c, againstOf(x));
    });
  }

  /** Releases the lock: each client's vote against (none: released
   * there), the votes not in when a majority decided it added as they come. */
  async release(h: Held): Promise<Votes> {
    this.unkeep(h);
    const against = new Map<Client, Against>();
    if (h.kind === "one") {
      try {
        if (!(await h.lease.release())) against.set(this.clients[0], { kind: "locked" });
      } catch (e) {
        against.set(this.clients[0], againstOf(e));
      }
      return { against, settled: ALL_IN };
    }
    const late: Promise<void>[] = [];
    for (const l of h.leases) {
      let done: (all: unknown[]) => void = () => {};
      const every = new Promise<unknown[]>((resolve) => (done = resolve));
      const replies = await l._release(done);
      if (replies === null) {
        for (const c of this.clients) if (!against.has(c)) against.set(c, { kind: "locked" });
        continue;
      }
      this.releaseVotes(against, replies);
      if (replies.includes(NOT_IN)) late.push(every.then((all) => this.releaseVotes(against, all.map((r, i) => (replies[i] === NOT_IN ? r : NOT_IN)))));
    }
    return { against, settled: late.length === 0 ? ALL_IN : Promise.all(late).then(() => undefined) };
  }

  /** A release's replies (`NOT_IN`: not a vote yet) as votes against. */
  private releaseVotes(against: Map<Client, Against>, replies: unknown[]): void {
    this.clients.forEach((c, i) => {
      const x = replies[i];
      if (x === NOT_IN || against.has(c)) return;
      if (x instanceof Error) against.set(c, againstOf(x));
      else if (x !== 1) against.set(c, { kind: "locked" });
    });
  }

  private targets(): Target[] {
    return this.one ? [this.one.target] : this.quorum!.targets;
  }

  /** `args(resource)` for every resource on every client: each client's
   * vote against when a reply is not `want` (none: it was everywhere). */
  private async byName(lock: ByName, args: (resource: string) => Arg[], want: number): Promise<Map<Client, Against>> {
    const against = new Map<Client, Against>();
    const io = (this.one ?? this.quorum)!.ioTimeoutMs;
    await Promise.all(
      this.targets().map(async (t, i) => {
        for (const r of lock.resources) {
          try {
            if ((await t.call(r, args(r), io)) !== want) against.set(this.clients[i], { kind: "locked" });
          } catch (e) {
            against.set(this.clients[i], againstOf(e));
            return;
          }
        }
      }),
    );
    return against;
  }

  /** Releases the resources held with `value` (a lock known by its
   * resources and value only, or whose resources were changed): each
   * client's vote against. */
  async releaseByName(lock: ByName): Promise<Votes> {
    return { against: await this.byName(lock, (r) => ["LEASE.RELEASE", r, lock.value], 1), settled: ALL_IN };
  }

  /** Renews the resources held with `value` for `duration` ms (at most a
   * server lease: nothing renews it after). */
  extendByName(lock: ByName, duration: number): Promise<Map<Client, Against>> {
    return this.byName(lock, (r) => ["LEASE.RENEW", r, lock.value, this.ttlFor(duration)], 1);
  }

  /** The fencing token of each resource of `resources` held by `h`. */
  tokens(h: Held, resources: string[]): number[] {
    return h.kind === "one" ? resources.map(() => h.lease.token) : h.leases.map((l) => l.token);
  }

  /** `LEASE.FENCE` on `resource`, one of the lock's (`resources`): its
   * reply, or StaleToken (nothing ran). Several masters: on the majority
   * that committed the token. */
  async fence(h: Held, resources: string[], resource: string, call: FenceCall): Promise<unknown> {
    const at = resources.indexOf(resource);
    if (at < 0) throw new RangeError(`${resource} is not one of the lock's resources; nothing was sent`);
    if (h.kind === "quorum") return h.leases[at].fence(...call);
    return this.one!._call(resource, fenceArgs(resource, h.lease.token, call));
  }

  /** Extends the lock to `duration` ms from now (`forever`: `using`'s,
   * renewed until released): each client's vote against (none: extended
   * there); a majority against: not extended. */
  async extend(h: Held, duration: number, forever: boolean): Promise<Map<Client, Against>> {
    const against = new Map<Client, Against>();
    const leases: Array<Lease | QuorumLease> = h.kind === "one" ? [h.lease] : h.leases;
    const sent = now();
    for (const l of leases) {
      let ok = false;
      for (let k = 0; k < 3; k++) {
        try {
          ok = await l.renew(this.ttlFor(duration));
          break;
        } catch (e) {
          if (this.learn(e)) continue;
          const a = againstOf(e);
          for (const c of this.clients) if (!against.has(c)) against.set(c, a);
          break;
        }
      }
      if (!ok) for (const c of this.clients) if (!against.has(c)) against.set(c, { kind: "locked" });
    }
    if (against.size === 0) this.watch(h, forever ? null : sent + duration, duration);
    return against;
  }
}

export interface ByName {
  readonly resources: string[];
  /** The lock's value: the owner id of its leases. */
  readonly value: string;
}

/** When the server leases of `h` started to count (performance.now() ms):
 * the acquire's send, or the renewal after a wait; the earliest of a
 * quorum lock's. */
function grantedAt(h: Held): number {
  if (h.kind === "one") return h.lease.deadline - h.lease.ttlMs;
  return Math.min(...h.leases.map((l) => l.deadline - l.ttlMs + drift(l.ttlMs)));
}

/** Every vote of `t` against is "locked" (held by another lock), and there
 * is one at least. */
function allLocked(t: Try): boolean {
  return t.against.size > 0 && [...t.against.values()].every((a) => a.kind === "locked");
}
