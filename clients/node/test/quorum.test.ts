// Quorum leases (design.md S9) on independent masters: every server kind,
// the masters reached through both client libraries at once. The round
// trips are counted on the masters (INFO commandstats), silent masters
// accept no TCP at all.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import IORedis from "ioredis";
import { createClient } from "redis";

import { LeaseExpiring, LeaseLost, Outlier, QuorumClient, Redlock, StaleToken } from "../src";
import { KINDS, LIBS, Server, Silent, commandCalls, leaseInfo, raw, resetStats, sleep, waitUntil } from "./servers";

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
        // The acquire returns at the majority; the far master's answer, if
        // it comes later (a loaded machine), is reported when it comes.
        assert.ok(await waitUntil(2000, () => outliers.length > 0), "no outlier reported");
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

// --- Round trips (design.md S9, one round trip in the common case), counted
// on the masters with INFO commandstats.

const CYCLES = 20;

/** A lease's `committed`: a majority of the masters `answering`. Each step
 * is decided by the first majority to answer; a master that answers much
 * later (on a loaded machine) is not in `committed`, though it holds the
 * lease too. */
function committedWithin(committed: number[], answering: number[]): void {
  const n = Math.max(answering.length, Math.max(...answering) + 1);
  assert.ok(committed.length > Math.floor(n / 2) && committed.every((i) => answering.includes(i)), `${committed} of ${answering}`);
}

/** One LEASE.ACQUIRE per master per acquire: no step 3 (one acquire of the
 * run let through: on a machine so loaded that a master handles a request
 * more than 20 ms after the client read its clock, it answers above the
 * proposal). */
function oneRoundTripEach(acquires: number[], cycles = CYCLES): void {
  assert.ok(acquires.every((a) => a >= cycles) && acquires.reduce((t, a) => t + a - cycles, 0) <= 5, String(acquires));
}

for (const kind of KINDS) {
  describe(`round trips on five ${kind} masters with agreeing clocks`, () => {
    let servers: Server[];
    let ports: number[];
    let conns: object[];
    before(async () => {
      servers = await Promise.all([0, 1, 2, 3, 4].map(() => Server.start(kind)));
      ports = servers.map((s) => s.port);
      conns = await Promise.all(servers.map((s, i) => LIBS[i % 2].connect(s.port)));
    });
    after(async () => {
      await Promise.all(conns.map((c, i) => LIBS[i % 2].close(c)));
      await Promise.all(servers.map((s) => s.close()));
    });

    it("QuorumClient: one LEASE.ACQUIRE and one LEASE.RELEASE per master per cycle", async () => {
      const client = new QuorumClient(conns, { ioTimeoutMs: 200, watchdog: false });
      await resetStats(ports);
      let last = 0;
      for (let i = 0; i < CYCLES; i++) {
        const lease = await client.acquire("rt", 2000);
        assert.ok(lease && lease.token > last, "tokens of successive holdings increase");
        last = lease.token;
        assert.equal(await lease.release(), true);
      }
      // The releases not in when the release returned still arrive.
      assert.ok(await waitUntil(2000, async () => (await commandCalls(ports, "lease.release")).every((n) => n === CYCLES)), String(await commandCalls(ports, "lease.release")));
      oneRoundTripEach(await commandCalls(ports, "lease.acquire"));
    });

    it("the Redlock drop-in on several masters: one LEASE.ACQUIRE and one LEASE.RELEASE per master per cycle", async () => {
      const redlock = new Redlock(conns, { retryCount: 0 });
      await resetStats(ports);
      let last = 0;
      for (let i = 0; i < CYCLES; i++) {
        const lock = await redlock.acquire(["rtl"], 2000);
        assert.ok(lock.token > last);
        last = lock.token;
        await lock.release();
      }
      assert.ok(await waitUntil(2000, async () => (await commandCalls(ports, "lease.release")).every((n) => n === CYCLES)), String(await commandCalls(ports, "lease.release")));
      oneRoundTripEach(await commandCalls(ports, "lease.acquire"));
    });

    it("a client whose clock runs behind pays step 3 once, then proposes above the masters' clocks", async () => {
      const client = new QuorumClient(conns, { ioTimeoutMs: 200, watchdog: false });
      client._clockOffsetMs = -5000; // plays a client whose clock is 5 s slow
      await resetStats(ports);
      const lease = await client.acquire("behind", 2000);
      // Step 3 goes to the masters whose grant was in when step 1 was
      // decided (a majority; on a loaded machine not always all five).
      assert.ok(lease && lease.committed.length >= 3, String(lease?.committed));
      assert.equal(await lease.release(), true);
      // Every master's release comes after its acquire: all in once all are.
      assert.ok(await waitUntil(2000, async () => (await commandCalls(ports, "lease.release")).every((n) => n === 1)));
      assert.deepEqual(await commandCalls(ports, "lease.acquire"), ports.map((_, i) => 1 + Number(lease.committed.includes(i))), "step 1 everywhere, then step 3 where committed");
      await resetStats(ports);
      for (let i = 0; i < CYCLES; i++) {
        const again = await client.acquire("behind", 2000);
        assert.ok(again && (await again.release()));
      }
      // The calls to the masters not in when a step was decided finish in
      // the background: every release in, every acquire is.
      assert.ok(await waitUntil(2000, async () => (await commandCalls(ports, "lease.release")).every((n) => n === CYCLES)));
      oneRoundTripEach(await commandCalls(ports, "lease.acquire"));
    });

    it("clients that connect on their first command (ioredis lazyConnect) are not waited for", async () => {
      const lazy = ports.map((p) => new IORedis(p, "127.0.0.1", { lazyConnect: true }));
      try {
        const client = new QuorumClient(lazy, { ioTimeoutMs: 1000, watchdog: false });
        const t = now();
        const lease = await client.acquire("lazy", 3000);
        const took = now() - t;
        assert.ok(lease && (await lease.release()));
        assert.ok(took < 500, `the first acquire took ${took.toFixed(1)} ms: it waited for a connect that only its command starts`);
      } finally {
        lazy.forEach((c) => c.disconnect());
      }
    });

    it("a connection the server closed while idle is replaced before the next call: one acquire per master", async () => {
      const client = new QuorumClient(conns, { ioTimeoutMs: 1000, watchdog: false });
      const first = await client.acquire("idle", 2000);
      assert.ok(first && (await first.release()));
      await sleep(150);
      await resetStats(ports);
      // Every connection of the clients closed by the servers (the raw
      // check connection skipped), as a restart or the idle timeout does.
      for (const port of ports) {
        const r = await raw(port);
        await r.call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes");
        r.disconnect();
      }
      const lease = await client.acquire("idle", 2000);
      assert.ok(lease, "taken on the new connections");
      assert.deepEqual(lease.committed.length >= 3, true);
      assert.equal(await lease.release(), true);
      assert.ok(await waitUntil(2000, async () => (await commandCalls(ports, "lease.release")).every((n) => n === 1)), String(await commandCalls(ports, "lease.release")));
      assert.deepEqual(await commandCalls(ports, "lease.acquire"), [1, 1, 1, 1, 1], "sent once, on the new connection");
    });
  });
}

describe("a far-ahead master costs no round trip", () => {
  for (const kind of KINDS) {
    it(`on ${kind}: one LEASE.ACQUIRE per master per cycle, the outlier reported`, async () => {
      const servers = await Promise.all([0, 1, 2, 3, 4].map((i) => Server.start(kind, { clockShiftMs: i === 0 ? 400 * DAY_MS : undefined })));
      const ports = servers.map((s) => s.port);
      const conns = await Promise.all(servers.map((s, i) => LIBS[i % 2].connect(s.port)));
      try {
        const seen: Outlier[] = [];
        const client = new QuorumClient(conns, { ioTimeoutMs: 200, watchdog: false, onOutlier: (o) => seen.push(o) });
        await resetStats(ports);
        for (let i = 0; i < CYCLES; i++) {
          const lease = await client.acquire("far", 2000);
          assert.ok(lease);
          committedWithin(lease.committed, [1, 2, 3, 4]);
          assert.equal(await lease.release(), true);
        }
        assert.ok(await waitUntil(2000, async () => (await commandCalls(ports, "lease.release")).every((n) => n === CYCLES)));
        oneRoundTripEach(await commandCalls(ports, "lease.acquire"));
        // Reported when its answer comes (as the step is decided, or later
        // in the background), unless it came past the step's timeout.
        assert.ok(seen.length >= CYCLES / 2 && seen.length <= CYCLES && seen.every((o) => o.master === 0 && o.aheadMs > 399 * DAY_MS), String(seen.length));
      } finally {
        await Promise.all(conns.map((c, i) => LIBS[i % 2].close(c)));
        await Promise.all(servers.map((s) => s.close()));
      }
    });
  }
});

// --- Masters that accept no TCP connection at all.

// The ttl of the silent-master tests, and its step timeout (a third of it).
// A step timeout per silent master, or a step that waits for the slowest
// master, takes a step at least; a step decided by the majority that
// answers takes far less, with a loaded machine's connects.
const SILENT_TTL_MS = 900;
const STEP_MS = 300;

/** Clients of `n` masters: real servers of `kind`, and at the positions
 * `silent` masters that accept no TCP connection (connecting in the
 * background, their commands queued meanwhile: neither library's default
 * gives up before the step does). Both libraries in turn. */
async function someSilent(kind: string, n: number, silent: number[]): Promise<{ conns: object[]; close: () => Promise<void> }> {
  const masters = await Promise.all([...Array(n).keys()].map((i) => (silent.includes(i) ? Silent.start() : Server.start(kind))));
  const conns = masters.map((m, i) => {
    if (i % 2 === 0) return new IORedis(m.port, "127.0.0.1");
    const c = createClient({ socket: { host: "127.0.0.1", port: m.port } });
    c.on("error", () => undefined);
    c.connect().catch(() => undefined);
    return c;
  });
  return {
    conns,
    close: async () => {
      for (const c of conns) {
        if (c instanceof IORedis) c.disconnect();
        else (c as { destroy(): void }).destroy();
      }
      await Promise.all(masters.map((m) => m.close()));
    },
  };
}

for (const kind of KINDS) {
  describe(`QuorumClient on ${kind} with silent masters`, () => {
    it("3 of 7 silent still give a lease", async () => {
      const ms = await someSilent(kind, 7, [1, 3, 5]);
      try {
        const client = new QuorumClient(ms.conns, { watchdog: false });
        const lease = await client.acquire("job", SILENT_TTL_MS, { blockMs: 3000 });
        assert.ok(lease, "four masters answer: a majority");
        committedWithin(lease.committed, [0, 2, 4, 6]);
        assert.equal(await lease.release(), true);
      } finally {
        await ms.close();
      }
    });

    it("2 of 5 silent: an acquire, a renewal and a release are each decided without them, well within one step timeout", async () => {
      const ms = await someSilent(kind, 5, [0, 3]);
      try {
        const client = new QuorumClient(ms.conns, { watchdog: false });
        for (let i = 0; i < 2; i++) {
          let t = now();
          const lease = await client.acquire("job", SILENT_TTL_MS);
          const tookAcquire = now() - t;
          assert.ok(lease, "three of five");
          committedWithin(lease.committed, [1, 2, 4]);
          t = now();
          assert.equal(await lease.renew(), true);
          const tookRenew = now() - t;
          t = now();
          assert.equal(await lease.release(), true);
          const tookRelease = now() - t;
          const took = `acquire ${tookAcquire.toFixed(1)} ms, renew ${tookRenew.toFixed(1)} ms, release ${tookRelease.toFixed(1)} ms`;
          for (const ms of [tookAcquire, tookRenew, tookRelease]) assert.ok(ms < STEP_MS / 2, `${took}: a step waited for the silent masters`);
        }
      } finally {
        await ms.close();
      }
    });
  });
}

const now = (): number => performance.now();
