// Labels (`LABEL`) and the waiters' list (`LEASE.WAITERS`), design.md S11,
// through every acquire path of the helper, against real servers: every
// server kind of the matrix, with both client libraries.

import assert from "node:assert/strict";
import { hostname } from "node:os";
import { basename } from "node:path";
import { after, before, describe, it } from "node:test";

import { FOREVER, LeaseClient, QuorumClient, Waiter, defaultLabel } from "../src";
import Redlock from "../src/redlock";
import { KINDS, LIBS, Server, leaseInfo, raw, waitUntil } from "./servers";

type Raw = Awaited<ReturnType<typeof raw>>;

async function labelOf(r: Raw, key: string): Promise<unknown> {
  const info = await leaseInfo(r, key);
  assert.ok(info, `${key} is not held`);
  return info.label;
}

/** The label of each holder of a counting or shared lease, by token. */
async function holderLabels(r: Raw, key: string): Promise<unknown[]> {
  const info = await leaseInfo(r, key);
  assert.ok(info);
  return (info.holders as unknown[][]).map((h) => h[h.indexOf("label") + 1]);
}

/** The waiters' list once it has at least `n` entries (up to 5 s). */
async function waiting(client: LeaseClient, key: string, n: number): Promise<Waiter[]> {
  let found: Waiter[] = [];
  assert.ok(await waitUntil(5000, async () => (found = await client.waiters(key)).length >= n), `${found.length} waiters, not ${n}`);
  return found;
}

for (const kind of KINDS) {
  for (const lib of LIBS) {
    describe(`labels and waiters on ${kind} with ${lib.name}`, { concurrency: true }, () => {
      let server: Server;
      let conn: object;
      let r: Raw;
      before(async () => {
        server = await Server.start(kind);
        conn = await lib.connect(server.port);
        r = await raw(server.port);
      });
      after(async () => {
        await lib.close(conn);
        r.disconnect();
        await server.close();
      });

      it("the default label names the host, the pid and the main script, computed once", async () => {
        const expected = `${hostname()} pid ${process.pid} ${basename(process.argv[1])}`;
        assert.equal(defaultLabel(), expected);
        const client = new LeaseClient(conn);
        assert.equal(client.label, expected);
        const lease = await client.acquire("{d}:job", 10000);
        assert.ok(lease);
        assert.equal(await labelOf(r, "{d}:job"), expected);
        const info = await leaseInfo(r, "{d}:job");
        const since = Number(info!.since);
        assert.ok(Math.abs(since - Date.now()) < 60_000, "since is unix time in ms");
        assert.equal(await lease.renew(), true);
        assert.equal(Number((await leaseInfo(r, "{d}:job"))!.since), since, "a renewal keeps since");
        await lease.release();
        await client.close();
      });

      it("a label per client or per call, or none", async () => {
        const off = new LeaseClient(conn, { label: null });
        let lease = await off.acquire("{l}:a", 10000);
        assert.equal(await labelOf(r, "{l}:a"), null);
        await lease!.release();
        lease = await off.acquire("{l}:a", 10000, { label: "this call" });
        assert.equal(await labelOf(r, "{l}:a"), "this call");
        await lease!.release();
        const mine = new LeaseClient(conn, { label: "worker-7 job 991" });
        const cases: Array<[Parameters<LeaseClient["acquire"]>[2], unknown]> = [
          [{}, "worker-7 job 991"],
          [{ label: undefined }, "worker-7 job 991"],
          [{ label: null }, null],
          [{ label: false }, null],
          [{ label: "" }, null],
          [{ label: Buffer.from("buffer label") }, "buffer label"],
          [{ label: "é".repeat(200) }, "é".repeat(128)],
          [{ label: "x" + "é".repeat(200) }, "x" + "é".repeat(127)],
        ];
        for (const [options, expected] of cases) {
          const held = await mine.acquire("{l}:b", 10000, options);
          assert.ok(held);
          assert.equal(await labelOf(r, "{l}:b"), expected, JSON.stringify(options));
          await held.release();
        }
        await assert.rejects(mine.acquire("{l}:c", 10000, { label: 12 as unknown as string }), TypeError);
        assert.equal(await leaseInfo(r, "{l}:c"), null, "nothing sent");
        assert.throws(() => new LeaseClient(conn, { label: true as unknown as string }), TypeError);
        await off.close();
        await mine.close();
      });

      it("labels on shared and limit holders, and on every key of a multi-key lease", async () => {
        const client = new LeaseClient(conn, { label: "pool" });
        const one = await client.acquire("{s}:sem", 10000, { limit: 2, label: "permit 1" });
        const two = await new LeaseClient(conn).acquire("{s}:sem", 10000, { limit: 2, label: null });
        assert.deepEqual(await holderLabels(r, "{s}:sem"), ["permit 1", null]);
        const reader = await client.acquire("{s}:rw", 10000, { shared: true });
        assert.deepEqual(await holderLabels(r, "{s}:rw"), ["pool"]);
        await client.usingMany(["{s}:1", "{s}:2"], 10000, { label: "transfer 12" }, async () => {
          assert.equal(await labelOf(r, "{s}:1"), "transfer 12");
          assert.equal(await labelOf(r, "{s}:2"), "transfer 12");
        });
        const many = await client.leaseMany(["{s}:1", "{s}:2"], 10000);
        assert.equal(await labelOf(r, "{s}:2"), "pool");
        await many.release();
        for (const l of [one, two, reader]) assert.equal(await l!.release(), true);
        await client.close();
      });

      it("the waiters' list shows each waiter's label, mode and time, oldest first, at most COUNT", async () => {
        const lister = new LeaseClient(conn);
        assert.deepEqual(await lister.waiters("{w}:job"), []);
        for (const h of ["holder", "other holder"]) assert.ok(await r.call("LEASE.ACQUIRE", "{w}:job", h, 10000, "LIMIT", 2));
        const first = new LeaseClient(conn, { label: "first waiter" });
        const second = new LeaseClient(conn, { label: null });
        const a = first.acquire("{w}:job", 10000, { blockMs: FOREVER, limit: 2 });
        await waiting(lister, "{w}:job", 1);
        const b = second.acquire("{w}:job", 10000, { blockMs: 8000, limit: 2 });
        const ws = await waiting(lister, "{w}:job", 2);
        assert.deepEqual(ws.map((w) => w.label), ["first waiter", null], "oldest first");
        assert.deepEqual(ws.map((w) => [w.mode, w.limit, w.keys]), [["limit", 2, 1], ["limit", 2, 1]]);
        assert.equal(ws[0].timeoutMs, null, "BLOCK 0 waits forever");
        assert.ok(ws[1].timeoutMs !== null && ws[1].timeoutMs > 0 && ws[1].timeoutMs <= 8000);
        assert.ok(ws.every((w) => w.waitedMs >= 0 && Number.isInteger(w.client) && w.client > 0));
        assert.deepEqual((await lister.waiters("{w}:job", { count: 1 })).map((w) => w.label), ["first waiter"], "COUNT 1: the oldest");
        await assert.rejects(lister.waiters("{w}:job", { count: 0 }), RangeError);
        await assert.rejects(lister.waiters("{w}:job", { count: 1001 }), RangeError);
        // A place freed: the first waiter is served with its label, then the second.
        assert.equal(await r.call("LEASE.RELEASE", "{w}:job", "holder"), 1);
        const la = await a;
        assert.ok(la);
        assert.ok((await holderLabels(r, "{w}:job")).includes("first waiter"));
        await la.release();
        const lb = await b;
        assert.ok(lb);
        await lb.release();
        assert.deepEqual(await lister.waiters("{w}:job"), []);
        for (const c of [lister, first, second]) await c.close();
      });

      it("a multi-key waiter is listed with its key count, and its label becomes its holding's", async () => {
        const client = new LeaseClient(conn);
        assert.ok(await r.call("LEASE.ACQUIRE", "{t}:2", "holder", 10000));
        const p = client.acquireMany(["{t}:1", "{t}:2"], 10000, { blockMs: 5000, label: "mover" });
        const [w] = await waiting(client, "{t}:2", 1);
        assert.deepEqual([w.mode, w.keys, w.label], ["keys", 2, "mover"]);
        assert.equal(await r.call("LEASE.RELEASE", "{t}:2", "holder"), 1);
        const lease = await p;
        assert.ok(lease);
        assert.equal(await labelOf(r, "{t}:1"), "mover");
        assert.equal(await labelOf(r, "{t}:2"), "mover");
        await lease.release();
        await client.close();
      });

      it("the Redlock drop-in takes a label setting, per Redlock and per acquire", async () => {
        const plain = new Redlock([conn]);
        let lock = await plain.acquire(["{r}:a"], 5000);
        assert.equal(await labelOf(r, "{r}:a"), defaultLabel());
        await lock.release();
        lock = await plain.acquire(["{r}:a"], 5000, { label: "this lock" });
        assert.equal(await labelOf(r, "{r}:a"), "this lock");
        await lock.release();
        const labelled = new Redlock([conn], { retryCount: 0, label: "nightly report" });
        assert.equal(labelled.settings.label, "nightly report");
        lock = await labelled.acquire(["{r}:a", "{r}:b"], 5000);
        assert.equal(await labelOf(r, "{r}:a"), "nightly report");
        assert.equal(await labelOf(r, "{r}:b"), "nightly report");
        await lock.release();
        await labelled.using(["{r}:a"], 5000, { label: null }, async () => {
          assert.equal(await labelOf(r, "{r}:a"), null);
        });
        await plain._one!.close();
        await labelled._one!.close();
      });
    });
  }
}

describe(`labels of quorum leases on ${KINDS[0]}`, () => {
  const servers: Server[] = [];
  const conns: object[] = [];
  let rs: Raw[] = [];
  before(async () => {
    for (let i = 0; i < 3; i++) servers.push(await Server.start(KINDS[0]));
    for (const s of servers) conns.push(await LIBS[0].connect(s.port));
    rs = await Promise.all(servers.map((s) => raw(s.port)));
  });
  after(async () => {
    for (const c of conns) await LIBS[0].close(c);
    for (const r of rs) r.disconnect();
    for (const s of servers) await s.close();
  });

  it("the quorum client and the Redlock drop-in on several masters label every master's holding", async () => {
    const client = new QuorumClient(conns, { ioTimeoutMs: 500, label: "quorum job" });
    await client.using("job", 5000, { blockMs: 1000 }, async () => {
      for (const r of rs) assert.equal(await labelOf(r, "job"), "quorum job");
    });
    await client.using("job", 5000, { blockMs: 1000, label: null }, async () => {
      for (const r of rs) assert.equal(await labelOf(r, "job"), null);
    });
    await client.close();
    const redlock = new Redlock(conns, { label: "redlock quorum" });
    const lock = await redlock.acquire(["job"], 5000);
    for (const r of rs) assert.equal(await labelOf(r, "job"), "redlock quorum");
    await lock.release();
    await redlock._locker.close();
  });
});
