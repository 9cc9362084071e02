// The I/O-free core: errors, loss reasons, owner ids, command arguments,
// timing rules, the watchdog's schedule and the quorum decisions. The same
// rules as the Python helper's _common.py and the Rust crate's protocol/;
// client.ts, quorum.ts and redlock.ts only do the I/O.

import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { basename } from "node:path";

// `await using` (TypeScript 5.2+) on Node versions without the symbol: the
// one TypeScript's own helpers look for.
(Symbol as { asyncDispose?: symbol }).asyncDispose ??= Symbol.for("Symbol.asyncDispose");

/** A command argument: sent as its string form. */
export type Arg = string | number | Buffer;

/** `blockMs: FOREVER` waits until the lease is ours (`BLOCK 0`). */
export const FOREVER = 0;

/** Why a lease is no longer held (the loss signal's `reason.loss`). */
export type Loss = "refused" | "expired" | "released";

/** The monotonic clock, in ms. */
export const now = (): number => performance.now();

export class LeaseError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** The lease could not be taken: another owner holds it (and the wait, if
 * any, ran out). */
export class LeaseBusy extends LeaseError {}

/** The server refused the lease because it is in a grace period (design.md
 * S7), not because another owner holds it: no new lease on that server for
 * `remainingMs` more (`reason`: promoted, restart or no-data). Read from the
 * server's `INFO lease` right after the refusal. */
export class LeaseGrace extends LeaseBusy {
  constructor(
    key: unknown,
    public readonly remainingMs: number,
    public readonly reason: string,
  ) {
    super(`${String(key)}: the server is in a grace period (${reason}): no new lease for ${remainingMs} ms more`);
  }
}

/** `LEASE.FENCE` answered `STALE`: the token is not current, nothing ran. */
export class StaleToken extends LeaseError {}

/** `LEASE.FENCE ... MINTTL ms` answered `EXPIRING`: the token is current,
 * but the lease (for a counting or shared lease, this holder's holding) had
 * `leftMs` left, less than the `minTtlMs` asked for; nothing ran. The lease
 * is still held (so this is not a StaleToken): renew and try again, or stop. */
export class LeaseExpiring extends LeaseError {
  constructor(
    message: string,
    public readonly leftMs: number,
    public readonly minTtlMs: number,
  ) {
    super(message);
  }
}

/** The options of a fence, given before the command:
 * `lease.fence({ minTtlMs: 5000 }, "HSET", k, f, v)`. */
export interface FenceOptions {
  /** Also refuse, with LeaseExpiring and nothing run, when the lease has
   * less than this many ms left when the server decides
   * (`LEASE.FENCE key token MINTTL ms ...`): an integer >= 0. */
  minTtlMs?: number;
}

/** A fence's arguments: the command, optionally after its options. */
export type FenceCall = [FenceOptions, ...Arg[]] | Arg[];

function isFenceOptions(a: unknown): a is FenceOptions {
  return typeof a === "object" && a !== null && !Buffer.isBuffer(a);
}

/** `LEASE.FENCE key token [MINTTL ms] command...` from a fence's arguments;
 * a bad `minTtlMs` is a RangeError, nothing sent. */
export function fenceArgs(key: Arg, token: number, call: FenceCall): Arg[] {
  const [first, ...rest] = call;
  if (!isFenceOptions(first)) return ["LEASE.FENCE", key, token, ...(call as Arg[])];
  const command = rest as Arg[];
  const ms = first.minTtlMs;
  if (ms === undefined) return ["LEASE.FENCE", key, token, ...command];
  if (!Number.isInteger(ms) || ms < 0) throw new RangeError(`minTtlMs must be an integer >= 0 (milliseconds), not ${String(ms)}`);
  return ["LEASE.FENCE", key, token, "MINTTL", ms, ...command];
}

/** A SHARED holder's token fenced a write command: refused, nothing ran. */
export class SharedWrite extends LeaseError {}

/** A write to a guarded key was refused: `FENCED write to '<key>' refused:
 * its hash tag is guarded by '<guard>' ...` (design.md S12). `guard`, a
 * lease key, guards the hash tag of `key` (`LeaseClient.guard`): every
 * other key of its database with that tag can be written only through
 * `LEASE.FENCE guard token ...` with the token of the lease held on `guard`
 * now, which is what `lease.fence(...)` of a lease on `guard` sends. Nothing
 * ran, nothing changed; reads are never refused.
 *
 * The helpers throw it for their own calls (a fence through a lease on
 * another key of the tag, say); `Fenced.of(e)` reads it out of the error of
 * a call of your own (a plain write, a pipeline, a MULTI). `key` and `guard`
 * are the names as the server prints them: printable ASCII (any other byte
 * as `?`), cut at 64 bytes with `...`. */
export class Fenced extends LeaseError {
  constructor(
    message: string,
    /** A key the refused command writes, whose hash tag is guarded. */
    public readonly key: string,
    /** The key that guards its hash tag: write through a lease on it. */
    public readonly guard: string,
  ) {
    super(message);
  }

  /** `e` as a Fenced when it is a FENCED refusal (an error of ioredis or
   * node-redis, also one of a pipeline's or a MULTI's replies); null
   * otherwise:
   *
   * ```ts
   * await redis.hset("{acct:7}", "balance", 10).catch((e) => { throw Fenced.of(e) ?? e; });
   * ```
   */
  static of(e: unknown): Fenced | null {
    if (e instanceof Fenced) return e;
    if (!(e instanceof Error)) return null;
    const m = FENCED.exec(e.message);
    return m ? new Fenced(e.message, m[1], m[2]) : null;
  }
}

// The refusal names the guard twice: the second time settles where the key
// ends, should a key hold the words that follow it.
const FENCED = /FENCED write to '([^]*)' refused: its hash tag is guarded by '([^]*)'; write it through LEASE\.FENCE \2 <token>/;

/** `LEASE.GUARD key`: `key` guards its hash tag (design.md S12). */
export function guardArgs(key: string): Arg[] {
  return ["LEASE.GUARD", key];
}

/** What `LEASE.GUARD` answers when it guards: `OK` (the server's refusals
 * come as errors); a LeaseError for anything else. */
export function guarded(reply: unknown): void {
  const text = Buffer.isBuffer(reply) ? reply.toString() : reply;
  if (text !== "OK") throw new LeaseError(`unexpected reply to LEASE.GUARD: ${String(reply)}`);
}

/** `LEASE.UNGUARD key`: `key` stops guarding its hash tag. */
export function unguardArgs(key: string): Arg[] {
  return ["LEASE.UNGUARD", key];
}

/** What `LEASE.UNGUARD` answered: true when the key guarded its tag (and now
 * does not), false when it did not. */
export function unguarded(reply: unknown): boolean {
  return reply === 1;
}

/** This client already holds a lease on this key (not released, not lost):
 * raised at once, nothing sent. */
export class AlreadyHeld extends LeaseError {
  constructor(public readonly key: string) {
    super(`${key} is already held by this client: use that lease or release it first`);
  }
}

/** The lease is lost: the loss signal's `reason`, and what `using(...)`
 * throws when the work ended normally after the lease was lost. */
export class LeaseLost extends LeaseError {
  constructor(public readonly loss: Loss) {
    super(`lease lost: ${loss}`);
  }
}

/** The LeaseLost of a loss signal's `reason`: made without a stack trace
 * (it says what happened to the lease, not where the code was), which
 * keeps a release cheap. */
export function lossReason(loss: Loss): LeaseLost {
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = 0;
  try {
    return new LeaseLost(loss);
  } finally {
    Error.stackTraceLimit = limit;
  }
}

/** No reply in time (the reply may still come: a lost reply). */
export class ReplyTimeout extends LeaseError {}

/** A fresh owner id: 16 random bytes as 32 hex digits. */
export function newOwner(): string {
  return randomBytes(16).toString("hex");
}

/** `[remainingMs, reason]` of a running grace period from an `INFO lease`
 * reply; null when none runs. */
export function graceOf(info: unknown): [number, string] | null {
  const text = Buffer.isBuffer(info) ? info.toString() : String(info);
  const fields = new Map<string, string>();
  for (const line of text.split(/\r?\n/)) {
    const at = line.indexOf(":");
    if (at > 0) fields.set(line.slice(0, at), line.slice(at + 1).trim());
  }
  const remaining = Number(fields.get("lease_grace_remaining_ms") ?? "0");
  if (!Number.isFinite(remaining) || remaining <= 0) return null;
  return [remaining, fields.get("lease_grace_reason") ?? "unknown"];
}

/** A server error reply of either client library (ioredis `ReplyError`,
 * node-redis `ErrorReply`). */
export function isReplyError(e: unknown): e is Error {
  if (!(e instanceof Error)) return false;
  for (let p = Object.getPrototypeOf(e); p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    const name = (p.constructor as { name?: string }).name;
    if (name === "ReplyError" || name === "ErrorReply") return true;
  }
  return false;
}

/** A cluster redirection (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`). */
export function isRedirect(e: unknown): boolean {
  return isReplyError(e) && /^(MOVED|ASK|TRYAGAIN|CLUSTERDOWN) /.test(e.message);
}

/** `STALE ...` as StaleToken, `EXPIRING ...` as LeaseExpiring, a reader's
 * fenced write as SharedWrite, a write to a guarded key (`FENCED ...`) as
 * Fenced, anything else unchanged. */
export function checkStale(e: unknown): unknown {
  if (isReplyError(e)) {
    if (e.message.startsWith("STALE")) return new StaleToken(e.message);
    const expiring = /^EXPIRING lease has (\d+) ms left, less than MINTTL (\d+)/.exec(e.message);
    if (expiring) return new LeaseExpiring(e.message, Number(expiring[1]), Number(expiring[2]));
    if (e.message.includes("a SHARED holder's token cannot fence a write command")) return new SharedWrite(e.message);
    if (e.message.startsWith("FENCED")) return Fenced.of(e) ?? e;
  }
  return e;
}

/** May the command have run without us hearing the answer? Anything that is
 * not an error reply of the server (I/O error, closed connection, timeout). */
export function lostReply(e: unknown): boolean {
  return !isReplyError(e) && !(e instanceof LeaseError && !(e instanceof ReplyTimeout));
}

export interface ModeOptions {
  /** A read lease (`SHARED`). */
  shared?: boolean;
  /** A counting lease of `n` holders (`LIMIT n`). */
  limit?: number;
}

/** `SHARED` or `LIMIT n` (or nothing: exclusive). */
export function modeArgs(mode: ModeOptions): Arg[] {
  if (mode.shared && mode.limit !== undefined) throw new RangeError("a lease is shared or limited, not both");
  if (mode.limit !== undefined) {
    if (!Number.isInteger(mode.limit) || mode.limit < 1) throw new RangeError("limit must be a positive integer");
    return ["LIMIT", mode.limit];
  }
  return mode.shared ? ["SHARED"] : [];
}

export function checkTtl(ttlMs: number, blockMs: number | undefined): void {
  if (!Number.isInteger(ttlMs) || ttlMs < 1) throw new RangeError("ttlMs must be a positive integer (milliseconds)");
  if (blockMs !== undefined && (!Number.isInteger(blockMs) || blockMs < 0))
    throw new RangeError("blockMs must be undefined (no wait), 0 (FOREVER) or a positive integer");
}

/** The keys of a multi-key lease: at least one, none twice; on a cluster all
 * in one slot. Checked before anything is sent. */
export function checkedKeys(keys: readonly string[], cluster: boolean): string[] {
  if (typeof keys === "string" || !Array.isArray(keys)) throw new TypeError("keys must be an array of keys");
  if (keys.length === 0) throw new RangeError("a multi-key lease needs at least one key");
  const seen = new Set<string>();
  for (const k of keys) {
    if (seen.has(k)) throw new RangeError(`${k} is given twice`);
    seen.add(k);
  }
  if (cluster) {
    const slot = keySlot(keys[0]);
    for (const k of keys.slice(1))
      if (keySlot(k) !== slot)
        throw new RangeError(`${keys[0]} and ${k} hash to different cluster slots (CROSSSLOT): give the keys one hash tag`);
  }
  return [...keys];
}

/** The wait of an acquire: its `BLOCK` option and the read timeout of its
 * reply (null: none, for `BLOCK 0`). `waitUntil`: monotonic end of a
 * `blockMs > 0` wait. */
export function withBlock(
  args: Arg[],
  blockMs: number | undefined,
  waitUntil: number | undefined,
  ioTimeoutMs: number,
  blockMarginMs: number,
): [Arg[], number | null] {
  if (blockMs === undefined) return [args, ioTimeoutMs];
  if (blockMs === FOREVER) return [[...args, "BLOCK", 0], null];
  const left = Math.ceil((waitUntil ?? 0) - now());
  // Nothing left of the wait (a retry at its end): once without BLOCK,
  // never BLOCK 0, which would wait forever.
  if (left <= 0) return [args, ioTimeoutMs];
  return [[...args, "BLOCK", left], left + blockMarginMs];
}

/** `label`: `LABEL text` or nothing (`labelArgs`), the same on every
 * attempt; before `BLOCK`, which `withBlock` puts last. */
export function acquireArgs(key: string, owner: string, ttlMs: number, mode: Arg[], label: Arg[] = []): Arg[] {
  return ["LEASE.ACQUIRE", key, owner, ttlMs, ...mode, ...label];
}

export function macquireArgs(keys: string[], owner: string, ttlMs: number, label: Arg[] = []): Arg[] {
  return ["LEASE.MACQUIRE", keys.length, ...keys, owner, ttlMs, ...label];
}

/** The longest label the server takes, in bytes. */
export const MAX_LABEL = 256;

/** A label option: a text (a string, or a Buffer as is); `null` (or `false`,
 * or an empty text) for none; `undefined` for the level above's (a call's:
 * its client's; a client's: this process's `defaultLabel()`). */
export type Label = string | Buffer | null | false | undefined;

/** `b` cut to MAX_LABEL bytes, never inside a UTF-8 character (a character
 * that does not fit is dropped whole). */
export function truncateLabel(b: Buffer): Buffer {
  if (b.length <= MAX_LABEL) return b;
  let cut = MAX_LABEL;
  // Back over continuation bytes (10xxxxxx): at most 3 in UTF-8.
  while (cut > MAX_LABEL - 4 && cut > 0 && (b[cut] & 0xc0) === 0x80) cut -= 1;
  return b.subarray(0, cut);
}

/** The name of the running program: `process.title` when the program set
 * one, else the main script's file name, else `node`. */
export function programName(): string {
  const title = process.title;
  if (title && basename(title) !== basename(process.execPath) && title !== "node") return title;
  const main = process.argv[1];
  return main ? basename(main) : "node";
}

let defaultText: string | undefined;

/** This process's default label, `<host> pid <pid> <program>` (e.g.
 * `web-3 pid 4242 worker.js`), at most 256 bytes. Computed once per
 * process. */
export function defaultLabel(): string {
  if (defaultText === undefined) {
    let host: string;
    try {
      host = hostname();
    } catch {
      host = "unknown-host";
    }
    defaultText = labelText(`${host} pid ${process.pid} ${programName()}`) as string;
  }
  return defaultText;
}

/** A text label cut to 256 bytes (`truncateLabel`); a string stays a
 * string. null: an empty text. */
function labelText(label: string | Buffer): string | Buffer | null {
  if (typeof label === "string") {
    if (Buffer.byteLength(label) > MAX_LABEL) label = truncateLabel(Buffer.from(label)).toString();
  } else {
    label = truncateLabel(label);
  }
  return label.length === 0 ? null : label;
}

/** What a label option sends: the text (`undefined` is `inherited` when
 * given, else this process's default), or null for none. TypeError for
 * anything else, before anything is sent. */
export function labelOf(label: Label, inherited?: string | Buffer | null): string | Buffer | null {
  if (label === undefined) return inherited !== undefined ? inherited : defaultLabel();
  if (label === null || label === false) return null;
  if (typeof label === "string" || Buffer.isBuffer(label)) return labelText(label);
  throw new TypeError(`label must be a string, a Buffer, null or undefined, not ${String(label)}`);
}

/** `LABEL text`, or nothing. */
export function labelArgs(label: string | Buffer | null): Arg[] {
  return label === null ? [] : ["LABEL", label];
}

/** One client waiting for a key (`LEASE.WAITERS`), oldest first. */
export interface Waiter {
  /** Its client id (`CLIENT KILL ID <id>` ends its wait). */
  readonly client: number;
  /** Its label (UTF-8), or null. */
  readonly label: string | null;
  /** `exclusive`, `shared`, `limit`, or `keys` for a multi-key waiter. */
  readonly mode: string;
  /** `n` of a `LIMIT n` waiter, else 0. */
  readonly limit: number;
  /** How many keys it waits for (1, or a multi-key waiter's). */
  readonly keys: number;
  /** How long it has waited, ms. */
  readonly waitedMs: number;
  /** The time left until its `BLOCK` timeout, ms; null: it waits forever
   * (`BLOCK 0`). */
  readonly timeoutMs: number | null;
}

/** `LEASE.WAITERS key [COUNT n]`; `count` (1 to 1000) is checked before
 * anything is sent. */
export function waitersArgs(key: string, count?: number): Arg[] {
  if (count === undefined) return ["LEASE.WAITERS", key];
  if (!Number.isInteger(count) || count < 1 || count > 1000) throw new RangeError(`count must be an integer from 1 to 1000, not ${count}`);
  return ["LEASE.WAITERS", key, "COUNT", count];
}

const text = (v: unknown): string => (Buffer.isBuffer(v) ? v.toString() : String(v));

/** The fields of one reply entry: a RESP2 flat array, a RESP3 map (a Map or
 * a plain object). */
function fieldsOf(entry: unknown): Map<string, unknown> {
  if (Array.isArray(entry)) {
    const out = new Map<string, unknown>();
    for (let i = 0; i + 1 < entry.length; i += 2) out.set(text(entry[i]), entry[i + 1]);
    return out;
  }
  if (entry instanceof Map) return new Map([...entry].map(([k, v]) => [text(k), v]));
  return new Map(Object.entries(entry as Record<string, unknown>));
}

/** The records of a `LEASE.WAITERS` reply. */
export function parseWaiters(reply: unknown): Waiter[] {
  if (!Array.isArray(reply)) return [];
  return reply.map((entry) => {
    const f = fieldsOf(entry);
    const timeout = Number(f.get("timeout"));
    const label = f.get("label");
    return {
      client: Number(f.get("client")),
      label: label === null || label === undefined ? null : text(label),
      mode: text(f.get("mode")),
      limit: Number(f.get("limit")),
      keys: Number(f.get("keys")),
      waitedMs: Number(f.get("waited")),
      timeoutMs: timeout < 0 ? null : timeout,
    };
  });
}

export function mrenewArgs(keys: string[], owner: string, ttlMs: number): Arg[] {
  return ["LEASE.MRENEW", keys.length, ...keys, owner, ttlMs];
}

export function mreleaseArgs(keys: string[], owner: string): Arg[] {
  return ["LEASE.MRELEASE", keys.length, ...keys, owner];
}

/** The renewal interval: a third of the ttl (ms). */
export function renewEvery(ttlMs: number): number {
  return Math.max(ttlMs / 3, 1);
}

/** The pause before a failed (not refused) renewal is tried again (ms). */
export function retryPause(ttlMs: number): number {
  return Math.min(Math.max(ttlMs / 20, 5), 250);
}

/** A renewal due within this many ms of a batch goes with it. */
export function renewWindow(ttlMs: number): number {
  return ttlMs / 12;
}

/** After a blocking acquire granted long after it was sent, the deadline
 * counted from the send is near: renew at once and count from that. */
export function needsFreshRenewal(sent: number, ttlMs: number): boolean {
  return now() - sent >= renewEvery(ttlMs);
}

/** A new lease's deadline and whether it is refused: ttl after the acquire
 * was sent, or after the renewal sent at `renewed` (its reply `reply`;
 * `count`: what renewing every key answers). */
export function deadlineAfter(
  sent: number,
  ttlMs: number,
  renewed: number | null,
  reply: unknown,
  count = 1,
): [number, boolean] {
  if (renewed === null || reply === null || reply === undefined) return [sent + ttlMs, false];
  if (reply === count) return [renewed + ttlMs, false];
  return [sent + ttlMs, true];
}

/** How a release is sent, given what the holder knows of its lease: held (a
 * lost reply retried), past its deadline (one short attempt), or refused
 * (nothing sent: the server said it is not ours). */
export type ReleasePlan = "full" | "short" | "none";

/** The bound of the one release attempt after the deadline passed (ms). */
export const SHORT_MS = 250;

export function releasePlan(loss: Loss | null): ReleasePlan {
  if (loss === "refused") return "none";
  if (loss === "expired") return "short";
  return "full";
}

/** The read timeouts of a release's attempts under `plan`. */
export function releaseAttempts(plan: ReleasePlan, ioTimeoutMs: number, retries: number): number[] {
  if (plan === "none") return [];
  if (plan === "short") return [SHORT_MS];
  return Array<number>(retries + 1).fill(ioTimeoutMs);
}

/** The retry plan of one acquire: a lost reply sent again with the same
 * owner (`retries` times, pausing a little longer each time), a cluster
 * redirection after the slots are learnt again (five times). */
export class Attempts {
  private lost = 0;
  private redirects = 0;
  constructor(private readonly retries: number) {}

  /** `[pause ms, refresh the slots first]` before the next try, or null:
   * give up with `e`. */
  after(e: unknown): [number, boolean] | null {
    if (isRedirect(e)) {
      this.redirects += 1;
      return this.redirects > 5 ? null : [0, true];
    }
    if (lostReply(e) && this.lost < this.retries) {
      this.lost += 1;
      return [20 * this.lost, false];
    }
    return null;
  }
}

// --- The watchdog's schedule -------------------------------------------

/** What the schedule needs of a lease's loss signal. */
export interface Signal {
  isSet(): boolean;
  readonly deadline: number;
  extend(sent: number, ttlMs: number): boolean;
  lose(loss: Loss): void;
}

interface Entry {
  key: string;
  ttlMs: number;
  next: number;
  args: Arg[];
  signal: Signal;
  count: number;
  /** Renewals stop here (performance.now() ms; null: no end): the last one
   * asks only for the time left, so the lease ends there. */
  until: number | null;
}

/** The renewals of one watchdog round, sent as one pipeline per node. */
export class Batch {
  readonly ids: number[] = [];
  readonly keys: string[] = [];
  readonly args: Arg[][] = [];
  /** The ttl each renewal asks for (shorter than the lease's for the last
   * renewal of a lease watched until an end). */
  readonly ttls: number[] = [];
  /** How long to wait for the replies: until the latest deadline of the
   * batch, at most the io timeout (ms). */
  timeout = 1;
  constructor(readonly sent: number) {}
}

/** The watchdog's plan for every lease of a client: when each renewal is
 * due, which go out together, what each reply does to its lease. */
export class Schedule {
  private leases = new Map<number, Entry>();
  private nextId = 0;
  private looksAt: number | null = null;
  renewals = 0;
  roundTrips = 0;

  /** Watches a lease from `first` on: its id, and whether the watchdog must
   * be woken (it would look too late). With `keys`, one `LEASE.MRENEW`.
   * With `until` (performance.now() ms), renewals stop there: the last one
   * asks only for the time left, so the lease ends at `until` (a lock
   * longer than the server's `lease.max-ttl-ms`). */
  add(key: string, owner: string, ttlMs: number, first: number, signal: Signal, keys?: string[], until: number | null = null): [number, boolean] {
    this.nextId += 1;
    const args = keys ? mrenewArgs(keys, owner, ttlMs) : ["LEASE.RENEW", key, owner, ttlMs];
    this.leases.set(this.nextId, { key, ttlMs, next: first, args, signal, count: keys ? keys.length : 1, until });
    return [this.nextId, this.looksAt === null || first < this.looksAt];
  }

  /** Moves the end of a watched lease (null: no end), just renewed: its
   * next renewal is at `next`. true: the watchdog must be woken. */
  setUntil(id: number, until: number | null, next: number): boolean {
    const e = this.leases.get(id);
    if (!e) return false;
    e.until = until;
    e.next = next;
    return this.looksAt === null || next < this.looksAt;
  }

  remove(id: number): void {
    this.leases.delete(id);
  }

  get size(): number {
    return this.leases.size;
  }

  /** Forgets the leases lost or released; then the batch of every renewal
   * due within its window, else the monotonic time to look again, or null
   * when no lease is left. */
  next(t: number, ioTimeoutMs: number): Batch | number | null {
    for (const [id, e] of this.leases) if (e.signal.isSet()) this.leases.delete(id);
    if (this.leases.size === 0) {
      this.looksAt = null;
      return null;
    }
    let first = Infinity;
    for (const e of this.leases.values()) first = Math.min(first, e.next);
    this.looksAt = Math.max(first, t);
    if (first > t) return first;
    const batch = new Batch(t);
    const ended: number[] = [];
    for (const [id, e] of this.leases) {
      if (e.next <= t + renewWindow(e.ttlMs)) {
        let ttl = e.ttlMs;
        let args = e.args;
        if (e.until !== null) {
          ttl = Math.min(e.ttlMs, Math.ceil(e.until - t));
          if (ttl < 1) {
            ended.push(id); // ends at `until` by itself
            continue;
          }
          args = [...args.slice(0, -1), ttl];
        }
        batch.ids.push(id);
        batch.keys.push(e.key);
        batch.args.push(args);
        batch.ttls.push(ttl);
        batch.timeout = Math.max(batch.timeout, Math.min(e.signal.deadline - t, ioTimeoutMs));
      }
    }
    for (const id of ended) this.leases.delete(id);
    if (batch.ids.length === 0) return this.next(t, ioTimeoutMs);
    return batch;
  }

  /** The replies to `batch` in its order (an Error, or undefined, for one
   * that failed or never came). */
  settle(batch: Batch, replies: unknown[], pipelines = 1): void {
    this.roundTrips += pipelines;
    this.renewals += batch.ids.length;
    batch.ids.forEach((id, n) => {
      const e = this.leases.get(id);
      if (!e) return;
      const reply = replies[n];
      const ttl = batch.ttls[n] ?? e.ttlMs;
      if (typeof reply === "number" && reply === e.count) {
        if (!e.signal.extend(batch.sent, ttl)) this.leases.delete(id);
        // The last renewal of a lease watched until an end: it ends there
        // unless setUntil moves the end meanwhile.
        else if (ttl < e.ttlMs && e.until !== null) e.next = e.until;
        else e.next = batch.sent + renewEvery(e.ttlMs);
      } else if (typeof reply === "number") {
        e.signal.lose("refused");
        this.leases.delete(id);
      } else {
        e.next = now() + retryPause(e.ttlMs);
      }
    });
  }

  stats(): { leases: number; renewals: number; roundTrips: number } {
    return { leases: this.leases.size, renewals: this.renewals, roundTrips: this.roundTrips };
  }
}

// --- Cluster slots -------------------------------------------------------

const CRC16_TABLE = (() => {
  const t = new Uint16Array(256);
  for (let i = 0; i < 256; i++) {
    let c = i << 8;
    for (let j = 0; j < 8; j++) c = c & 0x8000 ? ((c << 1) ^ 0x1021) & 0xffff : (c << 1) & 0xffff;
    t[i] = c;
  }
  return t;
})();

/** The cluster slot of a key (CRC16 of its hash tag, mod 16384). */
export function keySlot(key: string | Buffer): number {
  let b = Buffer.isBuffer(key) ? key : Buffer.from(key);
  const open = b.indexOf(0x7b);
  if (open >= 0) {
    const close = b.indexOf(0x7d, open + 1);
    if (close > open + 1) b = b.subarray(open + 1, close);
  }
  let crc = 0;
  for (const byte of b) crc = ((crc << 8) & 0xffff) ^ CRC16_TABLE[((crc >> 8) ^ byte) & 0xff];
  return crc & 16383;
}

// --- Quorum leases (design.md S9) ----------------------------------------

/** The clock drift allowed for a ttl (ms): 1% of it plus 2 ms. */
export function drift(ttlMs: number): number {
  return ttlMs / 100 + 2;
}

export function quorumOf(n: number): number {
  return Math.floor(n / 2) + 1;
}

/** How long one master may take to answer one step (ms). */
export function nodeTimeout(ioTimeoutMs: number, ttlMs: number): number {
  return Math.min(ioTimeoutMs, ttlMs / 3);
}

/** A random pause before another quorum try: up to a tenth of the ttl (1 to
 * 50 ms), so that contenders fall out of step. */
export function backoff(ttlMs: number): number {
  return Math.max(Math.random() * Math.min(Math.max(ttlMs / 10, 1), 50), 0.2);
}

/** True: a majority renewed. False: too many refused (the loss). null: not
 * enough answers yet. */
export function renewOutcome(replies: unknown[], n: number): boolean | null {
  const q = quorumOf(n);
  let yes = 0;
  let no = 0;
  for (let k = 0; k < replies.length; k++) {
    if (replies[k] === 1) yes++;
    else if (replies[k] === 0) no++;
  }
  if (yes >= q) return true;
  if (no > n - q) return false;
  return null;
}

/** A master left out of a quorum acquisition because its clock runs far
 * ahead: in step 3, the others refused its token as too far ahead of their
 * clocks (the `FLOOR` bound), and the token committed is the highest that a
 * majority accepts instead; or, when a majority answered the proposal of
 * step 1 exactly (one round trip), its token came back more than 1 s of
 * clock above it. Its clock is wrong. */
export interface Outlier {
  /** Its index in the client's list. */
  master: number;
  /** Its address (`host:port`). */
  addr: string;
  /** The token it granted, which the others refused (or which is far above
   * the proposal that a majority answered). */
  token: number;
  /** The token tried next in its place: the highest that the masters which
   * refused it granted (or the proposal). */
  instead: number;
  /** How far ahead its token is of that one, in ms of wall clock (a token
   * counts 1024 per ms): about how far its clock runs ahead. */
  aheadMs: number;
}

/** A master's refusal of a `FLOOR` token as too far ahead of its clock,
 * read from the error alone (it names `FLOOR` and says how far ahead), never
 * from the bound's value, which is the server's to choose. */
export function floorRefused(reply: unknown): boolean {
  return isReplyError(reply) && reply.message.includes("FLOOR") && reply.message.includes("ahead");
}

/** A master's reply that is not in yet (a step's replies in so far). */
export const NOT_IN: unique symbol = Symbol("not in");

/** A step's replies once it is over: a master not in counts as timed out. */
export function timedOut(replies: unknown[]): unknown[] {
  return replies.map((r) => (r === NOT_IN ? new ReplyTimeout("no reply within the step") : r));
}

const isToken = (r: unknown): r is number => typeof r === "number" && Number.isSafeInteger(r);

/** Tokens count 1024 per ms of wall clock (design.md S2). */
export const PER_MS = 1024;
const MAX_TOKEN = 2 ** 53 - 1;
/** How far above the masters' clocks (as learned) a proposal goes. */
export const HEADROOM_MS = 20;
/** The furthest a proposal goes above them to stay above this client's
 * previous one: well inside the FLOOR bound (max(grace, 1000) ms). */
export const MAX_AHEAD_MS = 250;

/** The proposals of step 1 (design.md S9, one round trip in the common
 * case), one per client: `P = (now_ms + offsetMs + 20) * 1024 + r`, `r`
 * random in 1..255, or the previous proposal + 1 when that is higher and at
 * most 250 ms ahead. `offsetMs` is learned from step 1's replies: the `q`-th
 * smallest of, for each master that answered a clock token `t` (ten zero
 * low bits, not `P`), `floor(t / 1024) - sentMs`, and for every other
 * master the offset as it was (docs/guarantees.md). The same as the Python
 * and Rust helpers' `Proposer`. */
export class Proposer {
  offsetMs = 0;
  private last = 0;

  propose(nowMs: number, randomBits: number): number {
    const at = (aheadMs: number): number => Math.max(nowMs + this.offsetMs + aheadMs, 1) * PER_MS;
    const fromClock = at(HEADROOM_MS) + 1 + (randomBits % 255);
    const next = this.last + 1;
    const p = next > fromClock && next <= at(MAX_AHEAD_MS) ? next : fromClock;
    this.last = Math.min(p, MAX_TOKEN);
    return this.last;
  }

  learn(sentMs: number, p: number, replies: unknown[]): void {
    if (replies.length === 0) return;
    const samples = replies
      .map((r) => (isToken(r) && r !== p && r % PER_MS === 0 ? Math.floor(r / PER_MS) - sentMs : this.offsetMs))
      .sort((a, b) => a - b);
    this.offsetMs = samples[Math.floor(replies.length / 2)];
  }
}

/** Held with `token` on the masters `on`. */
export class Held {
  constructor(
    readonly token: number,
    readonly on: number[],
  ) {}
}

/** A step that no majority can make: release everywhere, try again. */
export const FAILED: unique symbol = Symbol("failed");

/** Step 1's outcome from the replies in so far (`NOT_IN`: not yet) of the
 * masters `on` to the proposal `p`, null while undecided: held as soon as a
 * majority answered exactly `p`; step 3 (a Commit) as soon as that cannot
 * happen and a majority granted; FAILED as soon as a majority cannot grant. */
export function firstOutcome(p: number, on: number[], replies: unknown[], quorum: number): Held | Commit | typeof FAILED | null {
  // Counted first, without allocating: undecided while a majority of
  // exact answers can still come.
  let exact = 0;
  let open = 0;
  for (let k = 0; k < replies.length; k++) {
    if (replies[k] === p) exact++;
    else if (replies[k] === NOT_IN) open++;
  }
  if (exact < quorum && exact + open >= quorum) return null;
  let pending = 0;
  const grants: [number, number][] = [];
  const votes: number[] = [];
  replies.forEach((r, n) => {
    if (r === NOT_IN) pending++;
    else if (isToken(r)) {
      grants.push([on[n], r]);
      if (r === p) votes.push(on[n]);
    }
  });
  if (votes.length >= quorum) return new Held(p, votes);
  if (votes.length + pending >= quorum) return null;
  if (grants.length + pending < quorum) return FAILED;
  return Commit.first(grants, quorum) ?? FAILED;
}

/** The masters whose step-1 token came back more than 1 s of clock above
 * the proposal `p` that a majority answered exactly (1 s: the least FLOOR
 * bound): the outliers of a holding taken in one round trip. */
export function fastOutliers(p: number, on: number[], replies: unknown[], addr: (i: number) => string): Outlier[] {
  const out: Outlier[] = [];
  replies.forEach((r, n) => {
    if (isToken(r) && r > p + 1000 * PER_MS) out.push({ master: on[n], addr: addr(on[n]), token: r, instead: p, aheadMs: Math.floor((r - p) / PER_MS) });
  });
  return out;
}

/** How long a decided step still waits for the masters not in yet (so that
 * those about as fast as the majority count too), ms: as long again as it
 * took so far, at least 25 ms, never past the step's own deadline. */
export function linger(tookMs: number): number {
  return Math.max(tookMs, 25);
}

/** A release's outcome from the replies in so far: true a majority
 * released, false too many did not (or did not answer), null undecided. */
export function releaseOutcome(replies: unknown[], n: number): boolean | null {
  const q = quorumOf(n);
  let yes = 0;
  let no = 0;
  for (let k = 0; k < replies.length; k++) {
    if (replies[k] === 1) yes++;
    else if (replies[k] !== NOT_IN) no++;
  }
  if (yes >= q) return true;
  if (no > n - q) return false;
  return null;
}

/** Step 3 of a quorum acquisition, one round at a time: `LEASE.ACQUIRE ...
 * FLOOR token` to the masters `on`. The first round sends the highest token
 * granted in step 1 to every master that granted. When fewer than a
 * majority answer it exactly but a majority refused it as too far ahead of
 * their clocks, the next round leaves out the masters that granted it
 * (outliers) and sends, to the masters that refused, the highest token they
 * granted; each round leaves at least one master out, so there are at most
 * N. Any two majorities still share a master, so tokens of successive
 * holdings still increase. (The Python helper's `Commit`.) */
export class Commit {
  constructor(
    private readonly grants: Map<number, number>,
    readonly on: number[],
    readonly token: number,
    private readonly quorum: number,
  ) {}

  /** The first round, from step 1's `[master, token]` grants; null when
   * fewer than `quorum` masters granted. */
  static first(grants: [number, number][], quorum: number): Commit | null {
    if (grants.length < quorum || grants.length === 0) return null;
    return new Commit(new Map(grants), grants.map(([i]) => i), Math.max(...grants.map(([, t]) => t)), quorum);
  }

  /** The round's outcome from the replies in so far (in the order of `on`;
   * `NOT_IN`: not yet), null while undecided: the masters that committed
   * `token` as soon as a majority did (held); the next round and the
   * outliers it leaves out as soon as a majority refused it as too far
   * ahead; FAILED as soon as neither can happen. */
  decide(replies: unknown[], addr: (i: number) => string): number[] | [Commit, Outlier[]] | typeof FAILED | null {
    const committed = this.on.filter((_, n) => replies[n] === this.token);
    const pending = replies.filter((r) => r === NOT_IN).length;
    if (committed.length >= this.quorum) return committed;
    const refused = this.on.filter((_, n) => floorRefused(replies[n]));
    if (refused.length < this.quorum) return Math.max(committed.length, refused.length) + pending >= this.quorum ? null : FAILED;
    const instead = Math.max(...refused.map((i) => this.grants.get(i) ?? 0));
    const outliers = this.on
      .filter((i) => this.grants.get(i) === this.token)
      .map((i) => ({ master: i, addr: addr(i), token: this.token, instead, aheadMs: Math.floor((this.token - instead) / PER_MS) }));
    return [new Commit(this.grants, refused, instead, this.quorum), outliers];
  }
}

/** A quorum fence's outcome from the replies of the masters that committed
 * the token: the first reply of a master where the token was current once
 * at least `quorum` such came; else, when the token was current on a
 * majority but MINTTL refused it on some, the first of those
 * (LeaseExpiring); else StaleToken. */
export function fencedReply(replies: unknown[], quorum: number): unknown {
  const refusal = (r: unknown) => (isReplyError(r) ? checkStale(r) : null);
  const expiring = replies.map(refusal).filter((r) => r instanceof LeaseExpiring);
  const ran = replies.filter((r) => !(r instanceof Error) || (isReplyError(r) && !(refusal(r) instanceof StaleToken) && !(refusal(r) instanceof LeaseExpiring)));
  if (ran.length < quorum && expiring.length > 0 && ran.length + expiring.length >= quorum) throw expiring[0];
  if (ran.length < quorum) throw new StaleToken("STALE the quorum token is not current on a majority; the command ran on fewer");
  if (ran[0] instanceof Error) throw checkStale(ran[0]);
  return ran[0];
}
