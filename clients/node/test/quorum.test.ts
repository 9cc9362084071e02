// Quorum leases (design.md S9) on independent masters: every server kind,
// the masters reached through both client libraries at once.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { LeaseExpiring, LeaseLost, Outlier, QuorumClient, StaleToken } from "../src";
import { KINDS, LIBS, Server, leaseInfo, raw, sleep } from "./servers";

const DAY_MS = 86400000;

for (const kind of KINDS) {
  describe(`QuorumClient on five ${kind} masters`, { concurrency: true }, () => {
    let servers: Server[];
    let conns: object[];
    before(async () => {
      servers = await Promise.all([0, 1, 2, 3, 4].map(() => Server.start(kind)));
      // Masters 0, 2, 4 through ioredis, 1 and 3 through node-redis.
      conns = await Promise.all(servers.map((s, i) => LIBS[i % 2].connect(s.port)));
    });
    after(async () => {
      await Promise.all(conns.map((c, i) => LIBS[i % 2].close(c)));
      await Promise.all(servers.map((s) => s.close()));
    });

    it("one token committed on a majority, renewed, fenced, released", async () => {
      const client = new QuorumClient(conns);
      const lease = await client.acquire("one", 600);
      assert.ok(lease);
      assert.ok(lease.committed.length >= 3);
      for (const i of lease.committed) {
        const r = await raw(servers[i].port);
        assert.equal(Number((await leaseInfo(r, "one"))!.token), lease.token, `master ${i} committed the token`);
        r.disconnect();
      }
      assert.equal(await lease.fence("SET", "one:data", "x"), "OK");
      await sleep(900);
      assert.equal(lease.lost, false, "renewed by the watchdog");
      assert.equal(await new QuorumClient(conns).acquire("one", 1000), null);
      assert.equal(await lease.release(), true);
      assert.equal(lease.loss, "released");
      await assert.rejects(lease.fence("SET", "one:data", "y"), StaleToken);
    });

    it("a quorum fence with a minTtlMs longer than the lease runs nowhere and is LeaseExpiring", async () => {
      const client = new QuorumClient(conns);
      const lease = await client.acquire("mt", 2000);
      assert.ok(lease);
      await assert.rejects(lease.fence({ minTtlMs: 60000 }, "SET", "mt:data", "x"), LeaseExpiring);
      for (const i of lease.committed) {
        const r = await raw(servers[i].port);
        assert.equal(await r.get("mt:data"), null, `master ${i} ran nothing`);
        r.disconnect();
      }
      assert.equal(await lease.fence({ minTtlMs: 100 }, "SET", "mt:data", "y"), "OK");
      assert.equal(await lease.release(), true);
    });

    it("tokens of successive holdings strictly increase", async () => {
      const client = new QuorumClient(conns, { watchdog: false });
      let last = 0;
      for (let i = 0; i < 10; i++) {
        const lease = await client.acquire("seq", 5000, { blockMs: 2000 });
        assert.ok(lease && lease.token > last);
        last = lease.token;
        await lease.release();
      }
    });

    it("a majority that refuses the renewal is the loss: the signal says refused", async () => {
      const client = new QuorumClient(conns);
      const lease = await client.acquire("lose", 600);
      assert.ok(lease);
      for (const s of servers.slice(0, 3)) {
        const r = await raw(s.port);
        await r.del("lose");
        r.disconnect();
      }
      await new Promise((resolve) => lease.signal.addEventListener("abort", resolve));
      assert.equal((lease.signal.reason as LeaseLost).loss, "refused");
      await lease.release();
    });

    it("using a quorum lease releases it on every way out", async () => {
      const client = new QuorumClient(conns);
      assert.equal(await client.using("use", 5000, {}, async (lease) => lease.token > 0), true);
      await assert.rejects(
        client.using("use", 5000, {}, async () => {
          throw new Error("boom");
        }),
        /boom/,
      );
      const again = await client.acquire("use", 5000);
      assert.ok(again);
      await again.release();
    });
  });

  describe(`QuorumClient on ${kind}: a master whose clock is far ahead`, () => {
    it("is left out of the commit and reported; the lease is taken without it", async () => {
      const servers = await Promise.all([0, 1, 2].map((i) => Server.start(kind, { clockShiftMs: i === 0 ? 400 * DAY_MS : undefined })));
      const conns = await Promise.all(servers.map((s) => LIBS[0].connect(s.port)));
      try {
        const outliers: Outlier[] = [];
        const client = new QuorumClient(conns, { watchdog: false, onOutlier: (o) => outliers.push(o) });
        const lease = await client.acquire("far", 5000);
        assert.ok(lease);
        assert.deepEqual(lease.committed.sort(), [1, 2]);
        assert.equal(outliers.length, 1);
        assert.equal(outliers[0].master, 0);
        assert.equal(outliers[0].addr, `127.0.0.1:${servers[0].port}`);
        assert.ok(outliers[0].aheadMs > 399 * DAY_MS, String(outliers[0].aheadMs));
        assert.equal(outliers[0].instead, lease.token);
        await lease.release();
      } finally {
        await Promise.all(conns.map((c) => LIBS[0].close(c)));
        await Promise.all(servers.map((s) => s.close()));
      }
    });
  });
}
