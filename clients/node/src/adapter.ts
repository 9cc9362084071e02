// The thin I/O layer over the client the user passes: ioredis (Redis or
// Cluster) or node-redis (createClient or createCluster, v4 or v5). Every
// decision is in core.ts; this file only sends commands and bounds waits.
//
// Non-blocking commands share the user's (multiplexed) connection; a
// `BLOCK` acquire would stall every other command queued behind it there,
// so it runs on a connection of its own (a duplicate of the user's client,
// kept in a small idle pool).

import { Arg, ReplyTimeout, isRedirect, keySlot } from "./core.js";

/** An ioredis `Redis` or `Cluster`, or a node-redis client or cluster
 * (connected). Told apart at run time; neither library is a dependency. */
export type RedisClient = object;

/* eslint-disable @typescript-eslint/no-explicit-any */
type Any = any;

/** At most this many idle blocking connections are kept per node. */
const POOL_IDLE = 8;

/** `p`, or a ReplyTimeout after `ms` (null: no limit). The reply may still
 * come: the caller treats it as a lost reply. */
export function within<T>(p: Promise<T>, ms: number | null): Promise<T> {
  if (ms === null) return p;
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(new ReplyTimeout(`no reply within ${Math.round(ms)} ms`)), Math.max(ms, 1));
    p.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (e) => {
        clearTimeout(timer);
        reject(e);
      },
    );
  });
}

/** A connection of its own, for one blocking acquire at a time. */
export interface Dedicated {
  call(args: Arg[], timeoutMs: number | null): Promise<unknown>;
  /** Back to the idle pool (`reusable`), or closed: a connection whose
   * reply did not come may still deliver it, so it is never reused. */
  done(reusable: boolean): void;
}

export interface Target {
  readonly cluster: boolean;
  /** `host:port` of the server (of the first node for a cluster). */
  addr(): string;
  /** `args` on the user's client, routed by `key`, its reply within
   * `timeoutMs` (an error reply rejects with the library's error). */
  call(key: string, args: Arg[], timeoutMs: number | null): Promise<unknown>;
  /** Every command of `cmds` (each routed by its key), one pipeline per
   * node: each reply or the Error it failed with, and the pipelines sent. */
  batch(keys: string[], cmds: Arg[][], timeoutMs: number): Promise<[unknown[], number]>;
  /** A connection of its own, on the node of `key`, for a `BLOCK` acquire. */
  blocking(key: string): Promise<Dedicated>;
  /** Is the user's client free of a (re)connect in progress (no round
   * trip; a cluster: always)? A connection the server closed (a restart,
   * `CLIENT KILL`, its idle `timeout`) is not, until the library has
   * reopened it. */
  ready(): boolean;
  /** The connection a command sent now is written to at once, after every
   * command written to it before (the server runs them in that order);
   * null when not known or not open. */
  stream(): object | null;
  /** Resolves once `ready()`, or after `ms`. */
  whenReady(ms: number): Promise<void>;
  /** Learns the cluster's slots again (nothing for one server). */
  refresh(): Promise<void>;
  /** Closes the blocking connections kept idle. */
  close(): Promise<void>;
}

const str = (a: Arg): string | Buffer => (Buffer.isBuffer(a) ? a : String(a));

/** ioredis 5 (`isCluster` on both classes) or 4 (a Redis has none, but a
 * `status`; a Cluster has `isCluster`). */
function isIoredis(c: Any): boolean {
  return typeof c.call === "function" && typeof c.pipeline === "function" && (typeof c.isCluster === "boolean" || (typeof c.status === "string" && typeof c.duplicate === "function"));
}

function isNodeRedis(c: Any): boolean {
  return typeof c.sendCommand === "function" && typeof c.duplicate === "function" && "isOpen" in c;
}

/** node_redis v3 (`redis@3`, callbacks: what node-redlock v4 users have). */
function isNodeRedis3(c: Any): boolean {
  return typeof c.send_command === "function" && typeof c.duplicate === "function" && "connected" in c && !("isOpen" in c);
}

/** The Target for `client`; TypeError when it is neither library's. */
export function targetOf(client: RedisClient): Target {
  const c = client as Any;
  if (isIoredis(c)) return c.isCluster ? new IoCluster(c) : new IoRedis(c);
  if (isNodeRedis(c)) return typeof c.getSlotMaster === "function" ? new NodeCluster(c) : new NodeRedis(c);
  if (isNodeRedis3(c)) return new NodeRedis3(c);
  throw new TypeError("pass an ioredis Redis or Cluster, or a node-redis client or cluster (v4/v5, or v3 without a cluster)");
}

/** Whether an idle connection keeps the process alive: it does not (an
 * ioredis socket, or a node-redis client's ref/unref). */
function keepAlive(c: Any, alive: boolean): void {
  // node-redis 4/5: the client's ref/unref; ioredis and node_redis v3 (no
  // ref of its own): its socket's.
  const s = typeof c.unref === "function" && typeof c.ref === "function" ? c : c.stream;
  try {
    if (alive) s?.ref?.();
    else s?.unref?.();
  } catch {
    // closed
  }
}

/** Resolves when `c` emits "ready" (or once `ready()`), or after `ms`. */
function readyEvent(c: Any, ready: () => boolean, ms: number): Promise<void> {
  if (ready()) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const done = (): void => {
      clearTimeout(timer);
      c.off?.("ready", done);
      resolve();
    };
    const timer = setTimeout(done, Math.max(ms, 1));
    c.on?.("ready", done);
  });
}

/** A keyed pool of idle dedicated connections. */
class Idle<C> {
  private idle = new Map<string, C[]>();
  constructor(private readonly close: (c: C) => void) {}
  take(node: string): C | undefined {
    const c = this.idle.get(node)?.pop();
    if (c) keepAlive(c, true);
    return c;
  }
  give(node: string, c: C): void {
    const list = this.idle.get(node) ?? [];
    this.idle.set(node, list);
    if (list.length < POOL_IDLE) {
      keepAlive(c, false);
      list.push(c);
    } else this.close(c);
  }
  closeAll(): void {
    for (const list of this.idle.values()) list.forEach((c) => this.close(c));
    this.idle.clear();
  }
}

function ioDedicated(conn: Any, node: string, pool: Idle<Any>): Dedicated {
  return {
    call: (args, ms) => within(conn.call(String(args[0]), ...args.slice(1).map(str)), ms),
    done: (reusable) => (reusable && conn.status === "ready" ? pool.give(node, conn) : conn.disconnect()),
  };
}

/** Options of the helpers' own ioredis connections: errors surface at once
 * and nothing is resent behind the helper's back (it retries itself, with
 * the same owner and within its own bounds). */
const IO_OWN = {
  maxRetriesPerRequest: 0,
  autoResendUnfulfilledCommands: false,
  enableOfflineQueue: true,
  lazyConnect: false,
  // A connection of ours that broke is dropped, never reconnected.
  retryStrategy: (): null => null,
};

/** A node-redis duplicate for the helper's own use: a broken one is dropped,
 * never reconnected. */
async function nodeDuplicate(c: Any): Promise<Any> {
  const o = c.options ?? {};
  const conn = o.rootNodes
    ? c.duplicate({ defaults: { ...(o.defaults ?? {}), socket: { ...(o.defaults?.socket ?? {}), reconnectStrategy: false } } })
    : c.duplicate({ socket: { ...(o.socket ?? {}), reconnectStrategy: false } });
  conn.on("error", () => undefined);
  await conn.connect();
  return conn;
}

async function ioPipeline(conn: Any, cmds: Arg[][], ms: number): Promise<unknown[]> {
  const p = conn.pipeline();
  for (const a of cmds) p.call(String(a[0]), ...a.slice(1).map(str));
  const res: [Error | null, unknown][] = await within(p.exec(), ms);
  return res.map(([e, r]) => e ?? r);
}

class IoRedis implements Target {
  readonly cluster = false;
  private pool = new Idle<Any>((c) => c.disconnect());
  constructor(private readonly c: Any) {}
  stream(): object | null {
    // ioredis writes a command at once while ready, on this socket.
    return this.c.status === "ready" && this.c.stream ? (this.c.stream as object) : null;
  }
  addr(): string {
    const o = this.c.options ?? {};
    return o.path ?? `${o.host ?? "localhost"}:${o.port ?? 6379}`;
  }
  call(_key: string, args: Arg[], ms: number | null): Promise<unknown> {
    return within(this.c.call(String(args[0]), ...args.slice(1).map(str)), ms);
  }
  ready(): boolean {
    // Connecting or reconnecting: not yet. Any other state (ready; "wait",
    // a lazyConnect client the first command connects; closed for good)
    // has nothing to wait for.
    return !["connecting", "connect", "reconnecting"].includes(this.c.status);
  }
  whenReady(ms: number): Promise<void> {
    return readyEvent(this.c, () => this.ready(), ms);
  }
  async batch(_keys: string[], cmds: Arg[][], ms: number): Promise<[unknown[], number]> {
    try {
      return [await ioPipeline(this.c, cmds, ms), 1];
    } catch (e) {
      return [cmds.map(() => e), 1];
    }
  }
  async blocking(): Promise<Dedicated> {
    const conn = this.pool.take("") ?? this.c.duplicate(IO_OWN);
    conn.on?.("error", () => undefined);
    return ioDedicated(conn, "", this.pool);
  }
  async refresh(): Promise<void> {}
  async close(): Promise<void> {
    this.pool.closeAll();
  }
}

class IoCluster implements Target {
  readonly cluster = true;
  ready(): boolean {
    return true;
  }
  async whenReady(): Promise<void> {}
  private pool = new Idle<Any>((c) => c.disconnect());
  private byAddr = new Map<string, Any>();
  constructor(private readonly c: Any) {}
  stream(): object | null {
    return null;
  }
  addr(): string {
    const n = this.c.startupNodes?.[0] ?? {};
    return `${n.host ?? "localhost"}:${n.port ?? 6379}`;
  }
  /** The node's address and its ioredis connection, from the cluster's
   * slots (null until they are known: the cluster client routes then). */
  private node(key: string): [string, Any] | null {
    const addrs: string[] | undefined = this.c.slots?.[keySlot(key)];
    if (!addrs?.length) return null;
    let n = this.byAddr.get(addrs[0]);
    if (!n) {
      this.byAddr.clear();
      for (const r of this.c.nodes("master")) this.byAddr.set(`${r.options.host}:${r.options.port}`, r);
      n = this.byAddr.get(addrs[0]);
    }
    return n ? [addrs[0], n] : null;
  }
  call(key: string, args: Arg[], ms: number | null): Promise<unknown> {
    const conn = this.node(key)?.[1] ?? this.c;
    return within(conn.call(String(args[0]), ...args.slice(1).map(str)), ms);
  }
  async batch(keys: string[], cmds: Arg[][], ms: number): Promise<[unknown[], number]> {
    const groups = new Map<string, [Any, number[]]>();
    keys.forEach((k, i) => {
      const n = this.node(k);
      const id = n ? n[0] : `?${k}`;
      const g = groups.get(id) ?? [n ? n[1] : null, []];
      groups.set(id, g);
      g[1].push(i);
    });
    const replies: unknown[] = new Array(cmds.length);
    let moved = false;
    await Promise.all(
      [...groups.values()].map(async ([conn, idx]) => {
        try {
          const got = conn ? await ioPipeline(conn, idx.map((i) => cmds[i]), ms) : [await this.call(keys[idx[0]], cmds[idx[0]], ms)];
          idx.forEach((i, n) => (replies[i] = got[n]));
          moved ||= got.some(isRedirect);
        } catch (e) {
          idx.forEach((i) => (replies[i] = e));
        }
      }),
    );
    if (moved) await this.refresh();
    return [replies, groups.size];
  }
  async blocking(key: string): Promise<Dedicated> {
    const n = this.node(key);
    if (!n) {
      await this.refresh();
    }
    const [addr, node] = this.node(key) ?? ["", null];
    if (!node) throw new ReplyTimeout(`no node serves the slot of ${key} yet`);
    const conn = this.pool.take(addr) ?? node.duplicate(IO_OWN);
    conn.on?.("error", () => undefined);
    return ioDedicated(conn, addr, this.pool);
  }
  refresh(): Promise<void> {
    this.byAddr.clear();
    return within(
      new Promise<void>((resolve) => this.c.refreshSlotsCache(() => resolve())),
      5000,
    ).catch(() => undefined);
  }
  async close(): Promise<void> {
    this.pool.closeAll();
  }
}

function nodeClose(c: Any): void {
  try {
    if (typeof c.destroy === "function") c.destroy();
    else void c.disconnect().catch(() => undefined);
  } catch {
    // closed already
  }
}

class NodeRedis implements Target {
  readonly cluster = false;
  private pool = new Idle<Any>(nodeClose);
  constructor(private readonly c: Any) {}
  stream(): object | null {
    return null;
  }
  addr(): string {
    const s = this.c.options?.socket ?? {};
    if (s.path) return s.path;
    if (s.host || s.port) return `${s.host ?? "localhost"}:${s.port ?? 6379}`;
    const url = this.c.options?.url;
    return url ? String(url).replace(/^rediss?:\/\/([^@]*@)?/, "").replace(/\/.*$/, "") : "localhost:6379";
  }
  call(_key: string, args: Arg[], ms: number | null): Promise<unknown> {
    return within(this.c.sendCommand(args.map(str)), ms);
  }
  ready(): boolean {
    // Open but not ready: (re)connecting. A client not connected (or
    // closed) has nothing to wait for.
    return !(this.c.isOpen && this.c.isReady === false);
  }
  whenReady(ms: number): Promise<void> {
    return readyEvent(this.c, () => this.ready(), ms);
  }
  async batch(_keys: string[], cmds: Arg[][], ms: number): Promise<[unknown[], number]> {
    // node-redis writes every command of one tick in one write: a pipeline.
    const got = await Promise.allSettled(cmds.map((a) => this.call("", a, ms)));
    return [got.map((r) => (r.status === "fulfilled" ? r.value : r.reason)), 1];
  }
  async blocking(): Promise<Dedicated> {
    const conn = this.pool.take("") ?? (await nodeDuplicate(this.c));
    return {
      call: (args, ms) => within(conn.sendCommand(args.map(str)), ms),
      done: (reusable) => (reusable && conn.isReady ? this.pool.give("", conn) : nodeClose(conn)),
    };
  }
  async refresh(): Promise<void> {}
  async close(): Promise<void> {
    this.pool.closeAll();
  }
}

class NodeCluster implements Target {
  readonly cluster = true;
  ready(): boolean {
    return true;
  }
  async whenReady(): Promise<void> {}
  private pool = new Idle<Any>(nodeClose);
  constructor(private readonly c: Any) {}
  stream(): object | null {
    return null;
  }
  addr(): string {
    const n = this.c.options?.rootNodes?.[0];
    const s = n?.socket ?? {};
    return n?.url ?? `${s.host ?? "localhost"}:${s.port ?? 6379}`;
  }
  call(key: string, args: Arg[], ms: number | null): Promise<unknown> {
    return within(this.c.sendCommand(key, false, args.map(str)), ms);
  }
  private nodeOf(key: string): string {
    try {
      const m = this.c.getSlotMaster(keySlot(key));
      return m ? `${m.host}:${m.port}` : key;
    } catch {
      return key;
    }
  }
  async batch(keys: string[], cmds: Arg[][], ms: number): Promise<[unknown[], number]> {
    // One write per node and tick: node-redis pipelines them.
    const got = await Promise.allSettled(cmds.map((a, i) => this.call(keys[i], a, ms)));
    return [got.map((r) => (r.status === "fulfilled" ? r.value : r.reason)), new Set(keys.map((k) => this.nodeOf(k))).size];
  }
  async blocking(key: string): Promise<Dedicated> {
    // A duplicate of the cluster client, used by one blocking call at a
    // time: the node's connection of that duplicate waits alone.
    const conn = this.pool.take("") ?? (await nodeDuplicate(this.c));
    return {
      call: (args, ms) => within(conn.sendCommand(key, false, args.map(str)), ms),
      done: (reusable) => (reusable && conn.isOpen ? this.pool.give("", conn) : nodeClose(conn)),
    };
  }
  async refresh(): Promise<void> {
    // node-redis follows MOVED and learns the slots by itself.
  }
  async close(): Promise<void> {
    this.pool.closeAll();
  }
}

/** One command on a node_redis v3 client (callbacks). */
function send3(conn: Any, args: Arg[]): Promise<unknown> {
  return new Promise((resolve, reject) => {
    conn.send_command(String(args[0]), args.slice(1).map(str), (e: Error | null, r: unknown) => (e ? reject(e) : resolve(r)));
  });
}

/** A node_redis v3 connection of the helper's own: integers as numbers
 * (`string_numbers` off), a broken one dropped, never reconnected. */
function duplicate3(c: Any): Any {
  const conn = c.duplicate({ string_numbers: false, retry_strategy: () => undefined });
  conn.on("error", () => undefined);
  return conn;
}

/** node_redis v3 (one server): its commands on the user's client, unless
 * that one reads integers as strings (`string_numbers`), then on one
 * connection of the helper's own. */
class NodeRedis3 implements Target {
  readonly cluster = false;
  private pool = new Idle<Any>((c) => c.end(false));
  private own: Any = null;
  constructor(private readonly c: Any) {}
  private conn(): Any {
    if (!this.c.options?.string_numbers) return this.c;
    if (!this.own || this.own.closing) {
      this.own = duplicate3(this.c);
      keepAlive(this.own, false);
    }
    return this.own;
  }
  stream(): object | null {
    return null;
  }
  addr(): string {
    const o = this.c.options ?? {};
    return o.path ?? `${o.host ?? "127.0.0.1"}:${o.port ?? 6379}`;
  }
  call(_key: string, args: Arg[], ms: number | null): Promise<unknown> {
    return within(send3(this.conn(), args), ms);
  }
  ready(): boolean {
    // Connecting or reconnecting (not closed for good): not yet.
    const c = this.conn();
    return c.ready !== false || c.closing === true;
  }
  whenReady(ms: number): Promise<void> {
    return readyEvent(this.conn(), () => this.ready(), ms);
  }
  async batch(_keys: string[], cmds: Arg[][], ms: number): Promise<[unknown[], number]> {
    // node_redis writes the commands of one tick together: a pipeline.
    const got = await Promise.allSettled(cmds.map((a) => this.call("", a, ms)));
    return [got.map((r) => (r.status === "fulfilled" ? r.value : r.reason)), 1];
  }
  async blocking(): Promise<Dedicated> {
    const conn = this.pool.take("") ?? duplicate3(this.c);
    return {
      call: (args, ms) => within(send3(conn, args), ms),
      done: (reusable) => (reusable && conn.connected ? this.pool.give("", conn) : conn.end(false)),
    };
  }
  async refresh(): Promise<void> {}
  async close(): Promise<void> {
    this.pool.closeAll();
    this.own?.end(false);
    this.own = null;
  }
}
