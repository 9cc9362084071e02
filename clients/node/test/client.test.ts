// LeaseClient against real servers: every server kind of the matrix, with
// both client libraries (ioredis and node-redis).

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { AlreadyHeld, FOREVER, LeaseBusy, LeaseClient, LeaseExpiring, LeaseGrace, LeaseLost, SharedWrite, StaleToken } from "../src";
import { KINDS, LIBS, Server, leaseInfo, raw, sleep, waitUntil } from "./servers";

for (const kind of KINDS) {
  for (const lib of LIBS) {
    describe(`LeaseClient on ${kind} with ${lib.name}`, { concurrency: true }, () => {
      let server: Server;
      let conn: object;
      let client: LeaseClient;
      let r: Awaited<ReturnType<typeof raw>>;
      before(async () => {
        server = await Server.start(kind);
        conn = await lib.connect(server.port);
        client = new LeaseClient(conn);
        r = await raw(server.port);
      });
      after(async () => {
        await client.close();
        await lib.close(conn);
        r.disconnect();
        await server.close();
      });

      it("acquires with a token, fences a write, refuses another owner, releases", async () => {
        const lease = await client.acquire("{a}:lock", 10000);
        assert.ok(lease);
        assert.equal(typeof lease.token, "number");
        assert.ok(Number.isSafeInteger(lease.token) && lease.token > 0);
        assert.equal(await lease.fence("SET", "{a}:data", "v1"), "OK");
        assert.equal(await r.get("{a}:data"), "v1");
        const other = new LeaseClient(conn);
        assert.equal(await other.acquire("{a}:lock", 10000), null);
        assert.equal(await lease.release(), true);
        assert.equal(lease.signal.aborted, true);
        assert.equal((lease.signal.reason as LeaseLost).loss, "released");
        assert.equal(lease.loss, "released");
        assert.equal(await leaseInfo(r, "{a}:lock"), null);
        await assert.rejects(lease.fence("SET", "{a}:data", "v2"), StaleToken);
        assert.equal(await r.get("{a}:data"), "v1");
        const next = await other.acquire("{a}:lock", 10000);
        assert.ok(next && next.token > lease.token, "tokens increase");
        await next.release();
      });

      it("a second acquire of a key this client holds is AlreadyHeld, at once", async () => {
        const lease = await client.acquire("{b}:lock", 10000);
        assert.ok(lease);
        await assert.rejects(client.acquire("{b}:lock", 10000, { blockMs: 5000 }), AlreadyHeld);
        await lease.release();
        const again = await client.acquire("{b}:lock", 10000);
        assert.ok(again);
        await again.release();
      });

      it("a blocking acquire waits on its own connection and is served in arrival order", async () => {
        const holder = await client.acquire("{c}:lock", 10000);
        assert.ok(holder);
        const first = new LeaseClient(conn).acquire("{c}:lock", 10000, { blockMs: 5000 });
        await waitUntil(2000, async () => Number((await leaseInfo(r, "{c}:lock"))?.waiters) === 1);
        const second = new LeaseClient(conn).acquire("{c}:lock", 10000, { blockMs: 300 });
        // The shared connection is not stalled by the waiters.
        const t = Date.now();
        assert.equal(await holder.fence("SET", "{c}:x", "1"), "OK");
        assert.ok(Date.now() - t < 250);
        assert.equal(await second, null, "the later waiter times out, it never overtakes");
        await holder.release();
        const got = await first;
        assert.ok(got && got.token > holder.token);
        await got.release();
      });

      it("a blocking acquire with FOREVER waits until the lease is released", async () => {
        const holder = await client.acquire("{d}:lock", 10000);
        assert.ok(holder);
        const waiter = new LeaseClient(conn).acquire("{d}:lock", 10000, { blockMs: FOREVER });
        await sleep(150);
        await holder.release();
        const got = await waiter;
        assert.ok(got);
        await got.release();
      });

      it("the watchdog renews past the ttl, in batches, and signals a refusal", async () => {
        const own = new LeaseClient(conn);
        const leases = await Promise.all([0, 1, 2, 3, 4].map((i) => own.acquire(`{e}:lock${i}`, 300)));
        await sleep(700);
        for (const l of leases) assert.equal(l!.lost, false, "renewed past its ttl");
        const stats = own.watchdogStats();
        assert.ok(stats.renewals >= 10, `renewals ${stats.renewals}`);
        assert.ok(stats.roundTrips * 2 <= stats.renewals, `batched: ${JSON.stringify(stats)}`);
        const aborted = new Promise((resolve) => leases[0]!.signal.addEventListener("abort", resolve));
        await r.del("{e}:lock0");
        await aborted;
        assert.equal(leases[0]!.loss, "refused");
        assert.equal(await leases[0]!.release(), false, "nothing sent: known lost");
        for (const l of leases.slice(1)) assert.equal(await l!.release(), true);
      });

      it("without renewals the signal says expired at the client-side deadline", async () => {
        const own = new LeaseClient(conn, { watchdog: false });
        const lease = await own.acquire("{f}:lock", 1000);
        assert.ok(lease);
        assert.equal(lease.lost, false);
        await new Promise((resolve) => lease.signal.addEventListener("abort", resolve));
        assert.equal(lease.loss, "expired");
        assert.ok((lease.signal.reason as LeaseLost) instanceof LeaseLost);
        // One short attempt: the server's own expiry may come a moment later.
        assert.equal(typeof (await lease.release()), "boolean");
      });

      it("using releases on every way out and reports a loss during the work", async () => {
        const result = await client.using("{g}:lock", 10000, {}, async (lease) => {
          assert.equal(await lease.fence("INCR", "{g}:n"), 1);
          return "done";
        });
        assert.equal(result, "done");
        assert.equal(await leaseInfo(r, "{g}:lock"), null);
        await assert.rejects(
          client.using("{g}:lock", 10000, {}, async () => {
            throw new Error("boom");
          }),
          /boom/,
        );
        assert.equal(await leaseInfo(r, "{g}:lock"), null);
        await assert.rejects(
          client.using("{g}:lock", 300, {}, async (lease) => {
            await r.del("{g}:lock");
            await new Promise((resolve) => lease.signal.addEventListener("abort", resolve));
          }),
          (e: unknown) => e instanceof LeaseLost && e.loss === "refused",
        );
        const holder = await new LeaseClient(conn).acquire("{g}:lock", 10000);
        await assert.rejects(client.using("{g}:lock", 1000, {}, async () => 1), LeaseBusy);
        await holder!.release();
      });

      it("await using releases the lease", async () => {
        {
          await using lease = await client.lease("{h}:lock", 10000);
          assert.ok(lease.token > 0);
        }
        assert.equal(await leaseInfo(r, "{h}:lock"), null);
      });

      it("SHARED readers hold together, keep a writer out, and cannot fence a write", async () => {
        const a = await client.acquire("{i}:lock", 10000, { shared: true });
        const b = await new LeaseClient(conn).acquire("{i}:lock", 10000, { shared: true });
        assert.ok(a && b && b.token > a.token);
        assert.equal(await new LeaseClient(conn).acquire("{i}:lock", 10000), null);
        await assert.rejects(a.fence("SET", "{i}:data", "x"), SharedWrite);
        assert.equal(await a.fence("GET", "{i}:data"), null);
        await a.release();
        await b.release();
      });

      it("LIMIT n admits n holders", async () => {
        const own = () => new LeaseClient(conn);
        const a = await own().acquire("{j}:lock", 10000, { limit: 2 });
        const b = await own().acquire("{j}:lock", 10000, { limit: 2 });
        assert.ok(a && b);
        assert.equal(await own().acquire("{j}:lock", 10000, { limit: 2 }), null);
        await a.release();
        const c = await own().acquire("{j}:lock", 10000, { limit: 2 });
        assert.ok(c);
        await b.release();
        await c.release();
      });

      it("fence({ minTtlMs }) refuses with LeaseExpiring, runs nothing and keeps the lease", async () => {
        const lease = await client.acquire("{m}:lock", 2000);
        assert.ok(lease);
        await assert.rejects(lease.fence({ minTtlMs: 60000 }, "SET", "{m}:data", "v1"), (e: unknown) => {
          assert.ok(e instanceof LeaseExpiring && !(e instanceof StaleToken), String(e));
          assert.ok(e.leftMs >= 0 && e.leftMs <= 2000 && e.minTtlMs === 60000, String(e));
          return true;
        });
        assert.equal(await r.get("{m}:data"), null, "nothing ran");
        await assert.rejects(lease.fence({ minTtlMs: 60000 }), LeaseExpiring, "a check only");
        assert.equal(await lease.fence({ minTtlMs: 100 }, "SET", "{m}:data", "v2"), "OK");
        assert.equal(await lease.fence({}, "GET", "{m}:data"), "v2", "no option: a plain fence");
        assert.deepEqual(lease.fenceArgs({ minTtlMs: 5 }, "GET", "x"), ["LEASE.FENCE", "{m}:lock", lease.token, "MINTTL", 5, "GET", "x"]);
        for (const bad of [-1, 1.5, NaN]) assert.throws(() => lease.fenceArgs({ minTtlMs: bad }, "GET", "x"), RangeError);
        assert.equal(lease.lost, false);
        const many = await client.acquireMany(["{m}:a", "{m}:b"], 2000);
        assert.ok(many);
        await assert.rejects(many.fence("{m}:b", { minTtlMs: 60000 }, "SET", "{m}:x", "1"), LeaseExpiring);
        assert.equal(await many.fence("{m}:a", { minTtlMs: 100 }, "SET", "{m}:x", "2"), "OK");
        assert.equal(await r.get("{m}:x"), "2");
        assert.equal(await lease.release(), true);
        assert.equal(await many.release(), true);
      });

      it("acquireMany takes every key or none under one token, renews and releases them", async () => {
        const keys = ["{k}:a", "{k}:b", "{k}:c"];
        const busy = await new LeaseClient(conn).acquire("{k}:c", 10000);
        assert.equal(await client.acquireMany(keys, 10000), null);
        assert.equal(await leaseInfo(r, "{k}:a"), null, "nothing taken in part");
        await busy!.release();
        const lease = await client.acquireMany(keys, 300);
        assert.ok(lease);
        for (const k of keys) assert.equal(Number((await leaseInfo(r, k))!.token), lease.token);
        assert.equal(await lease.fence("{k}:b", "SET", "{k}:data", "1"), "OK");
        assert.throws(() => lease.fenceArgs("{k}:zzz", "GET", "x"), RangeError);
        await sleep(500);
        assert.equal(lease.lost, false, "renewed together");
        assert.equal(await lease.release(), true);
        for (const k of keys) assert.equal(await leaseInfo(r, k), null);
        await assert.rejects(client.acquireMany(["{k}:a", "{k}:a"], 1000), RangeError);
      });

    });

    describe(`LeaseClient on a server of its own, ${kind} with ${lib.name}`, () => {
      it("a lost acquire reply is retried with the same owner: one holding, the same token", async () => {
        const server = await Server.start(kind);
        const conn = await lib.connect(server.port);
        const r = await raw(server.port);
        after(async () => {
          r.disconnect();
          await lib.close(conn);
          await server.close();
        });
        const own = new LeaseClient(conn, { ioTimeoutMs: 150, retries: 5 });
        await r.call("CLIENT", "PAUSE", "400", "WRITE");
        const lease = await own.acquire("{l}:lock", 10000);
        assert.ok(lease);
        const info = await leaseInfo(r, "{l}:lock");
        assert.equal(Number(info!.token), lease.token);
        const stats = String(await r.call("INFO", "lease"));
        assert.match(stats, /lease_reacquired:[1-9]/);
        await lease.release();
      });

      it("a renewal with no reply before the deadline answers false, and once lost sends nothing", async () => {
        const server = await Server.start(kind);
        const conn = await lib.connect(server.port);
        after(async () => {
          await lib.close(conn);
          await server.close();
        });
        const own = new LeaseClient(conn, { watchdog: false });
        const lease = await own.acquire("{n}:lock", 500);
        assert.ok(lease);
        server.signal("SIGSTOP");
        try {
          assert.equal(await lease.renew(), false);
        } finally {
          server.signal("SIGCONT");
        }
        assert.equal(lease.loss, "expired");
        assert.equal(await lease.renew(), false);
      });

      it("a refusal during the grace period is LeaseGrace with the time left, not contention", async () => {
        const server = await Server.start(kind, { graceMs: 30000 });
        const conn = await lib.connect(server.port);
        try {
          const client = new LeaseClient(conn);
          const e = await client.acquire("{m}:lock", 1000).then(
            () => null,
            (err: unknown) => err,
          );
          assert.ok(e instanceof LeaseGrace, String(e));
          assert.ok(e.remainingMs > 0 && e.remainingMs <= 30000);
          assert.match(e.reason, /no-data|restart/);
          assert.ok(e instanceof LeaseBusy);
          await client.close();
        } finally {
          await lib.close(conn);
          await server.close();
        }
      });
    });
  }
}
