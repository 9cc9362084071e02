// Guarded keys (design.md S12) through the helper, against real servers:
// every server kind of the matrix with both client libraries, quorums of
// three masters, and a cluster on the first kind. guard/unguard and the
// server's refusals; a write through every fenced path the package offers
// (a lease's fence, with minTtlMs, fenceArgs on a client or in a MULTI of
// your own, a multi-key lease's, a quorum lease's, the Redlock drop-in's)
// lands on guarded data; the same write without the fence is refused with
// Fenced and changes nothing; a stale token is refused.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Fenced, LeaseClient, LeaseExpiring, QuorumClient, StaleToken } from "../src";
import Redlock, { ExecutionError } from "../src/redlock";
import { ClusterNodes, KINDS, LIBS, Server, leaseInfo, raw, waitUntil } from "./servers";

type Raw = Awaited<ReturnType<typeof raw>>;

/* eslint-disable @typescript-eslint/no-explicit-any */

/** `args` on a client of either library, as user code sends it: ioredis
 * `call`, node-redis `sendCommand` (with the key first on a cluster). */
function send(conn: object, args: (string | number)[]): Promise<unknown> {
  const c = conn as any;
  if (typeof c.call === "function" && typeof c.pipeline === "function") return c.call(String(args[0]), ...args.slice(1).map(String));
  if (typeof c.getSlotMaster === "function") return c.sendCommand(String(args[1]), false, args.map(String));
  return c.sendCommand(args.map(String));
}

/** `args` sent without the fence: refused with FENCED, read by Fenced.of. */
async function refusedPlain(conn: object, args: (string | number)[]): Promise<Fenced> {
  const e = await send(conn, args).then(
    () => assert.fail(`${args.join(" ")} was not refused`),
    (x: unknown) => x,
  );
  assert.ok(!(e instanceof Fenced), "a client of your own gives its library's error");
  const fenced = Fenced.of(e);
  assert.ok(fenced, `not a FENCED refusal: ${String(e)}`);
  return fenced;
}

/** A guard nobody holds: LEASE.INFO's map with null token, ttl, since and
 * label, and guard 1. */
function freeGuard(info: Record<string, unknown> | null): boolean {
  return info !== null && Number(info.guard) === 1 && ["token", "ttl", "since", "label"].every((f) => info[f] === null);
}

for (const kind of KINDS) {
  for (const lib of LIBS) {
    describe(`guarded keys on ${kind} with ${lib.name}`, { concurrency: true }, () => {
      let server: Server;
      let conn: object;
      let client: LeaseClient;
      let r: Raw;
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

      it("guard and unguard round trip; a write outside the guard's fence is refused with Fenced and changes nothing", async () => {
        const guard = "{g1}:lock";
        await r.set("{g1}", "before");
        assert.equal(await client.guard(guard), undefined);
        assert.equal(await client.guard(guard), undefined, "guarding again changes nothing");
        const info = await leaseInfo(r, guard);
        assert.ok(freeGuard(info) && Number(info!.waiters) === 0, JSON.stringify(info));

        const refusal = await refusedPlain(conn, ["SET", "{g1}", "after"]);
        assert.equal(refusal.key, "{g1}");
        assert.equal(refusal.guard, guard);
        assert.match(refusal.message, /^FENCED write to '\{g1\}' refused/);
        assert.equal(await r.get("{g1}"), "before", "reads pass, the write changed nothing");
        assert.equal((await refusedPlain(conn, ["DEL", "{g1}"])).key, "{g1}");
        // Names as the server prints them: cut at 64 bytes, other bytes as '?'.
        const long = "{g1}:" + "x".repeat(100);
        assert.equal((await refusedPlain(conn, ["SET", long, "v"])).key, long.slice(0, 64) + "...");
        assert.equal((await refusedPlain(conn, ["SET", "{g1}:café 'quoted'", "v"])).key, "{g1}:caf?? 'quoted'");
        assert.equal(await send(conn, ["SET", "{g1x}", "another tag"]), "OK");

        assert.equal(await client.unguard(guard), true);
        assert.equal(await client.unguard(guard), false, "it guards no more");
        assert.equal(await client.unguard("{never}:lock"), false);
        assert.equal(await send(conn, ["SET", "{g1}", "after"]), "OK");
      });

      it("the server's refusals of a guard are its error replies, not Fenced", async () => {
        const e = await client.guard("no-tag").catch((x: unknown) => x);
        assert.match(String((e as Error).message), /a guard needs a key with a hash tag/);
        assert.equal(Fenced.of(e), null);
        await client.guard("{g2}:lock");
        await assert.rejects(client.guard("{g2}:other"), /hash tag \{g2\} is already guarded by '\{g2\}:lock'/);
        const exclusive = /holds only exclusive leases/;
        await assert.rejects(client.acquire("{g2}:lock", 10000, { limit: 2 }), exclusive);
        await assert.rejects(client.acquire("{g2}:lock", 10000, { shared: true }), exclusive);
        const permit = await client.acquire("{g2sem}:lock", 10000, { limit: 2 });
        assert.ok(permit);
        await assert.rejects(client.guard("{g2sem}:lock"), exclusive);
        assert.equal(await permit.release(), true);
        await r.set("{g2s}:string", "v");
        await assert.rejects(client.guard("{g2s}:string"), /WRONGTYPE Operation/);
        await assert.rejects(client.unguard("{g2s}:string"), /WRONGTYPE Operation/);
        assert.equal(await leaseInfo(r, "{g2}:other"), null);
        assert.ok(freeGuard(await leaseInfo(r, "{g2}:lock")));
        assert.equal(await r.set("{g2sem}", "writable"), "OK");
      });

      it("every fence of a lease on the guard writes guarded data; without the fence, Fenced", async () => {
        const guard = "{g3}:lock";
        await client.guard(guard);
        const lease = await client.lease(guard, 10000);
        const info = await leaseInfo(r, guard);
        assert.equal(Number(info!.token), lease.token);
        assert.equal(Number(info!.guard), 1);
        assert.equal(await lease.fence("HSET", "{g3}", "balance", 90), 1);
        assert.equal(await lease.fence({ minTtlMs: 1000 }, "HINCRBY", "{g3}", "balance", 5), 95);
        await assert.rejects(lease.fence({ minTtlMs: 60000 }, "HINCRBY", "{g3}", "balance", 1000), LeaseExpiring);
        // fenceArgs on a client of your own, and in a MULTI of your own.
        assert.equal(await send(conn, lease.fenceArgs("HSET", "{g3}", "by", "own client") as string[]), 1);
        assert.equal(await send(conn, lease.fenceArgs({ minTtlMs: 1000 }, "HINCRBY", "{g3}", "balance", 1) as string[]), 96);
        const args = lease.fenceArgs("HINCRBY", "{g3}", "balance", 1).map(String);
        const replies = (await r.multi().call(args[0], ...args.slice(1)).hset("{g3}", "balance", 0).exec())!;
        assert.deepEqual(replies[0], [null, 97]);
        assert.equal(Fenced.of(replies[1][0])?.key, "{g3}", "the unfenced write is refused in EXEC's reply");
        assert.equal(await r.hget("{g3}", "balance"), "97");

        // The same write without the fence: refused, typed, nothing changed.
        assert.equal((await refusedPlain(conn, ["HSET", "{g3}", "balance", 0])).guard, guard);
        assert.equal((await refusedPlain(conn, ["HSET", "{g3}:new", "f", 1])).key, "{g3}:new");
        // Through a lease on another key of the tag: Fenced from the helper.
        const other = await client.lease("{g3}:other", 10000);
        const e = await other.fence("HSET", "{g3}", "balance", 0).catch((x: unknown) => x);
        assert.ok(e instanceof Fenced, String(e));
        assert.equal(e.key, "{g3}");
        assert.equal(e.guard, guard);
        assert.equal(await other.fence("HGET", "{g3}", "balance"), "97", "a read through it passes");
        assert.equal(await other.release(), true);
        assert.equal(await r.hget("{g3}", "balance"), "97");
        assert.equal(await r.exists("{g3}:new"), 0);
        assert.equal(await lease.release(), true);
        assert.ok(freeGuard(await leaseInfo(r, guard)), "the guard stays, free, after the release");
        assert.equal((await refusedPlain(conn, ["HSET", "{g3}", "balance", 0])).guard, guard);
      });

      it("a stale token's fenced write is refused on guarded data", async () => {
        const guard = "{g4}:lock";
        await client.guard(guard);
        const first = await client.lease(guard, 10000);
        assert.equal(await first.fence("SET", "{g4}", "v1"), "OK");
        assert.equal(await first.release(), true);
        await assert.rejects(first.fence("SET", "{g4}", "released"), StaleToken);

        // A lease that expires (no watchdog): stale once it ended.
        const short = await client.acquire(guard, 200, { watchdog: false });
        assert.ok(short && short.token > first.token);
        assert.equal(await short.fence("SET", "{g4}", "v2"), "OK");
        assert.ok(await waitUntil(3000, async () => short.lost && freeGuard(await leaseInfo(r, guard))));
        await assert.rejects(short.fence("SET", "{g4}", "expired"), StaleToken);
        await assert.rejects(short.fence({ minTtlMs: 0 }, "SET", "{g4}", "expired"), StaleToken);

        // The next holder's token is the current one; the old ones stay stale.
        const next = await client.lease(guard, 10000);
        assert.ok(next.token > short.token);
        await assert.rejects(short.fence("SET", "{g4}", "stale"), StaleToken);
        await assert.rejects(send(conn, first.fenceArgs("SET", "{g4}", "stale") as string[]), /STALE fencing token/);
        assert.equal(await next.fence("GET", "{g4}"), "v2");
        assert.equal(await next.release(), true);
        assert.equal(await r.get("{g4}"), "v2");
      });

      it("a multi-key lease writes guarded data through its guard key", async () => {
        const guard = "{g5}:lock";
        const other = "{g5}:7:lock";
        await client.guard(guard);
        const lease = await client.leaseMany([guard, other], 10000);
        assert.equal(await lease.fence(guard, "HINCRBY", "{g5}:7", "balance", -30), -30);
        assert.equal(await lease.fence(guard, { minTtlMs: 1000 }, "HINCRBY", "{g5}:9", "balance", 30), 30);
        await assert.rejects(lease.fence(guard, { minTtlMs: 60000 }, "HINCRBY", "{g5}:9", "balance", 1), LeaseExpiring);
        assert.equal(await send(conn, lease.fenceArgs(guard, "HSET", "{g5}:log", "last", "transfer") as string[]), 1);
        // Through its key that does not guard: the same token, but refused.
        const e = await lease.fence(other, "HINCRBY", "{g5}:7", "balance", 1).catch((x: unknown) => x);
        assert.ok(e instanceof Fenced, String(e));
        assert.equal(e.guard, guard);
        assert.equal((await refusedPlain(conn, ["HINCRBY", "{g5}:7", "balance", 1])).key, "{g5}:7");
        assert.equal(await lease.release(), true);
        await assert.rejects(lease.fence(guard, "HINCRBY", "{g5}:7", "balance", 1), StaleToken);
        assert.equal(await r.hget("{g5}:7", "balance"), "-30");
        assert.equal(await r.hget("{g5}:9", "balance"), "30");
        assert.ok(freeGuard(await leaseInfo(r, guard)));
        assert.equal(await leaseInfo(r, other), null);
      });

      it("the Redlock drop-in works as before on unguarded keys, and fences guarded data when its resource is the guard", async () => {
        await client.guard("{g6}:lock");
        const redlock = new Redlock([conn], { retryCount: 0 });
        // An unguarded resource: as before, a guard of another tag standing.
        const plain = await redlock.acquire(["g6-resource"], 5000);
        assert.equal(await plain.fence("SET", "g6-out", "1"), "OK");
        const longer = await plain.extend(10000);
        await assert.rejects(redlock.acquire(["g6-resource"], 5000), ExecutionError);
        await longer.release();
        assert.equal(await leaseInfo(r, "g6-resource"), null);
        assert.equal(await send(conn, ["SET", "g6-out", "2"]), "OK");
        assert.equal(await redlock.using(["g6-resource"], 1000, async (signal) => signal.aborted), false);

        // The guard as the resource: its fence writes the guarded data.
        const lock = await redlock.acquire(["{g6}:lock"], 5000);
        assert.equal(await lock.fence("HSET", "{g6}", "by", "redlock"), 1);
        assert.equal(await lock.fence({ minTtlMs: 1000 }, "HINCRBY", "{g6}", "n", 1), 1);
        assert.equal((await refusedPlain(conn, ["HSET", "{g6}", "by", "plain"])).guard, "{g6}:lock");
        await lock.release();
        assert.ok(freeGuard(await leaseInfo(r, "{g6}:lock")));
        await assert.rejects(lock.fence("HSET", "{g6}", "by", "stale"), StaleToken);
        // Several resources on one master, the guard first: one token.
        const both = await redlock.acquire(["{g6}:lock", "{g6}:other"], 5000);
        assert.equal(await both.fenceOn("{g6}:lock", "HINCRBY", "{g6}", "n", 1), 2);
        await assert.rejects(both.fenceOn("{g6}:other", "HINCRBY", "{g6}", "n", 1), Fenced);
        await both.release();
        assert.equal(await r.hget("{g6}", "by"), "redlock");
        assert.equal(await r.hget("{g6}", "n"), "2");
      });
    });
  }

  describe(`guarded keys on three ${kind} masters (quorum)`, () => {
    let servers: Server[];
    let conns: object[];
    before(async () => {
      servers = await Promise.all([0, 1, 2].map(() => Server.start(kind)));
      // Masters 0 and 2 through ioredis, 1 through node-redis.
      conns = await Promise.all(servers.map((s, i) => LIBS[i % 2].connect(s.port)));
      for (const c of conns) await new LeaseClient(c).guard("{job}:lock");
    });
    after(async () => {
      await Promise.all(conns.map((c, i) => LIBS[i % 2].close(c)));
      await Promise.all(servers.map((s) => s.close()));
    });

    // The step decides at a majority: a master that answers after the
    // linger (a loaded machine) is not among the committed ones, and the
    // fence writes where the token was committed.
    it("a quorum lease on the guard fences guarded data on the masters that committed its token; a stale token is refused", async () => {
      const client = new QuorumClient(conns, { ioTimeoutMs: 1000 });
      const lease = await client.lease("{job}:lock", 10000);
      assert.ok(lease.committed.length >= 2, String(lease.committed));
      // The fence goes to the masters whose acquire answer is still out too
      // (after it): on a quiet machine every master has committed by then,
      // and the data is checked where the token was committed.
      assert.equal(await lease.fence("SET", "{job}:out", "v1"), "OK");
      const committed = [...lease.committed].sort();
      assert.equal(await lease.fence({ minTtlMs: 1000 }, "INCR", "{job}:n"), 1);
      for (const [i, c] of conns.entries()) {
        if (committed.includes(i)) assert.equal(await send(c, ["GET", "{job}:out"]), "v1");
        assert.equal((await refusedPlain(c, ["SET", "{job}:out", "plain"])).guard, "{job}:lock");
      }
      assert.equal(await lease.release(), true);
      await assert.rejects(lease.fence("SET", "{job}:out", "stale"), StaleToken);
      for (const [i, s] of servers.entries()) {
        const r = await raw(s.port);
        if (committed.includes(i)) assert.equal(await r.get("{job}:out"), "v1", `master ${i}`);
        assert.ok(freeGuard(await leaseInfo(r, "{job}:lock")), `master ${i}`);
        r.disconnect();
      }
    });

    it("the Redlock drop-in on the masters fences guarded data when its resource is the guard", async () => {
      const redlock = new Redlock(conns, { retryCount: 10, retryDelay: 100 });
      const lock = await redlock.acquire(["{job}:lock"], 5000);
      assert.equal(await lock.fence("HSET", "{job}:h", "by", "redlock"), 1);
      await assert.rejects(lock.fenceOn("{job}:lock", { minTtlMs: 60000 }, "HSET", "{job}:h", "by", "x"), LeaseExpiring);
      await lock.release();
      await assert.rejects(lock.fence("HSET", "{job}:h", "by", "stale"), StaleToken);
      // An unguarded resource on the same masters: as before.
      const plain = await redlock.acquire(["q-plain"], 5000);
      assert.equal(await plain.fence("INCR", "q-plain:n"), 1);
      await plain.release();
      // Written where the lock's token was committed: a majority at least.
      let written = 0;
      for (const c of conns) if ((await send(c, ["HGET", "{job}:h", "by"])) === "redlock") written += 1;
      assert.ok(written >= 2, `written on ${written} masters`);
    });
  });
}

describe(`guarded keys on a cluster of three ${KINDS[0]} masters`, () => {
  let cluster: ClusterNodes;
  before(async () => {
    cluster = await ClusterNodes.start(KINDS[0]);
  });
  after(async () => cluster.close());

  for (const lib of LIBS) {
    it(`${lib.name}: guard and unguard go to the master of the key's slot; the fence writes there`, async () => {
      const conn = await lib.cluster(cluster.ports);
      const client = new LeaseClient(conn);
      try {
        // Tags whose slots spread over the masters.
        const tags = [0, 1, 2, 3, 4, 5].map((i) => `{${lib.name}${i}}`);
        for (const t of tags) await client.guard(`${t}:lock`);
        for (const t of tags) {
          const lease = await client.lease(`${t}:lock`, 10000);
          assert.equal(await lease.fence("SET", t, "fenced"), "OK");
          assert.equal((await refusedPlain(conn, ["SET", t, "plain"])).guard, `${t}:lock`);
          assert.equal(await lease.release(), true);
          assert.equal(await send(conn, ["GET", t]), "fenced");
          assert.equal(await client.unguard(`${t}:lock`), true);
          assert.equal(await send(conn, ["SET", t, "unguarded"]), "OK");
          assert.equal(await client.unguard(`${t}:lock`), false);
        }
      } finally {
        await client.close();
        await lib.close(conn);
      }
    });
  }
});
