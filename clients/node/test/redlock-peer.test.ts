// What node-redlock v5.0.0-beta.2's own tests (src/single.test.ts and
// src/multi.test.ts of its repository: they are not in its npm package)
// check, run on the drop-in against real servers. Each test below is one
// of theirs, in their order, with their durations (about 9e14 ms) and
// settings (the defaults: 11 attempts). Their reads of the lock's storage
// (`GET` of a string, `PTTL`) read the lease instead (LEASE.INFO: the
// token, the ttl of the server lease); the storage differs on purpose
// (README: "What differs on purpose").

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import IORedis, { Cluster as IOCluster } from "ioredis";

import Redlock, { ExecutionError, ResourceLockedError } from "../src/redlock";
import { ClusterNodes, FULL, KINDS, Server, leaseInfo, sleep } from "./servers";

type Conn = IORedis | IOCluster;

/** LEASE.INFO through a client or a cluster (routed by key). */
async function info(c: Conn, key: string): Promise<Record<string, unknown> | null> {
  return leaseInfo(c as IORedis, key);
}

async function tokenOf(c: Conn, key: string): Promise<number | null> {
  const i = await info(c, key);
  return i && i.token !== null && i.token !== undefined ? Number(i.token) : null;
}

const LONG = Math.floor(Number.MAX_SAFE_INTEGER / 10);

/** Every vote against of every attempt. */
async function votes(e: ExecutionError): Promise<Error[]> {
  const out: Error[] = [];
  for (const s of await Promise.allSettled(e.attempts)) {
    assert.equal(s.status, "fulfilled");
    if (s.status === "fulfilled") out.push(...s.value.votesAgainst.values());
  }
  return out;
}

function single(namespace: string, start: () => Promise<{ redis: Conn; stop(): Promise<void>; maxTtl(ms: number): Promise<boolean> }>): void {
  describe(`node-redlock v5's single.test.ts on the drop-in: ${namespace}`, () => {
    let redis: Conn;
    let env: Awaited<ReturnType<typeof start>>;
    before(async () => {
      env = await start();
      redis = env.redis;
    });
    after(async () => env.stop());

    it("refuses to use a non-integer duration", async () => {
      const redlock = new Redlock([redis]);
      await assert.rejects(redlock.acquire(["{redlock}float"], Number.MAX_SAFE_INTEGER / 10), { message: "Duration must be an integer value in milliseconds." });
    });

    it("acquires, extends, and releases a single lock (any duration)", async () => {
      const redlock = new Redlock([redis]);
      const t0 = Date.now();
      let lock = await redlock.acquire(["{redlock}a"], LONG);
      assert.equal(await tokenOf(redis, "{redlock}a"), lock.token);
      const drift = Math.round(0.01 * LONG) + 2;
      assert.ok(lock.expiration >= t0 + LONG - drift && lock.expiration <= Date.now() + LONG - drift, "the lock's expiration is its duration's, from its grant");
      const ttl = Number((await info(redis, "{redlock}a"))!.ttl);
      assert.ok(ttl > 0 && ttl <= 60000, "the server lease is at most lease.max-ttl-ms, renewed until the end");
      lock = await lock.extend(3 * LONG);
      assert.equal(await tokenOf(redis, "{redlock}a"), lock.token);
      assert.ok(lock.expiration > t0 + 2 * LONG);
      await lock.release();
      assert.equal(await info(redis, "{redlock}a"), null);
    });

    it("acquires, extends, and releases a multi-resource lock", async () => {
      const redlock = new Redlock([redis]);
      let lock = await redlock.acquire(["{redlock}a1", "{redlock}a2"], LONG);
      assert.equal(await tokenOf(redis, "{redlock}a1"), lock.token);
      assert.equal(await tokenOf(redis, "{redlock}a2"), lock.token);
      lock = await lock.extend(3 * LONG);
      assert.deepEqual(lock.tokens, [lock.token, lock.token]);
      assert.equal(await tokenOf(redis, "{redlock}a2"), lock.token);
      await lock.release();
      assert.equal(await info(redis, "{redlock}a1"), null);
      assert.equal(await info(redis, "{redlock}a2"), null);
    });

    it("a lock longer than the server lease is renewed until its end, and ends there", async (t) => {
      if (!(await env.maxTtl(600))) return t.skip("no CONFIG SET lease.max-ttl-ms on this server");
      try {
        const redlock = new Redlock([redis]);
        const lock = await redlock.acquire(["{redlock}r"], 1500);
        assert.ok(Number((await info(redis, "{redlock}r"))!.ttl) <= 600);
        await sleep(1000);
        assert.equal(await tokenOf(redis, "{redlock}r"), lock.token, "renewed past its server lease");
        await sleep(900);
        assert.equal(await info(redis, "{redlock}r"), null, "ended with the lock's duration");
        const long = await redlock.acquire(["{redlock}r"], LONG);
        await sleep(1000);
        assert.equal(await tokenOf(redis, "{redlock}r"), long.token);
        await long.release();
      } finally {
        await env.maxTtl(60000);
      }
    });

    it("locks fail when redis is unreachable: an ExecutionError, one vote against per attempt", async () => {
      const down = await Server.start(KINDS[0]);
      const port = down.port;
      await down.close();
      const unreachable = new IORedis({
        host: "127.0.0.1",
        port,
        maxRetriesPerRequest: 0,
        autoResendUnfulfilledCommands: false,
        autoResubscribe: false,
        retryStrategy: () => null,
        reconnectOnError: () => false,
      });
      unreachable.on("error", () => undefined);
      const redlock = new Redlock([unreachable]);
      const events: Error[] = [];
      redlock.on("error", (e: Error) => events.push(e));
      const e = await redlock.acquire(["{redlock}b"], LONG).catch((x: unknown) => x);
      assert.ok(e instanceof ExecutionError, `an ExecutionError, not ${String(e)}`);
      assert.equal(e.attempts.length, 11, "A failed acquisition must have the configured number of retries.");
      const against = await votes(e);
      assert.equal(against.length, 11);
      for (const v of against) assert.equal(v.message, "Connection is closed.");
      assert.equal(events.length, 11, "each vote against is an error event");
      unreachable.disconnect();
    });

    it("locks automatically expire", async () => {
      const redlock = new Redlock([redis]);
      const lock = await redlock.acquire(["{redlock}d"], 200);
      assert.equal(await tokenOf(redis, "{redlock}d"), lock.token);
      await sleep(300);
      const lock2 = await redlock.acquire(["{redlock}d"], 200);
      assert.equal(await tokenOf(redis, "{redlock}d"), lock2.token);
      await lock2.release();
      assert.equal(await info(redis, "{redlock}d"), null);
    });

    it("individual locks are exclusive (a try and one wait on the server, ResourceLockedError votes)", async () => {
      const redlock = new Redlock([redis]);
      const lock = await redlock.acquire(["{redlock}c"], LONG);
      const t0 = Date.now();
      const e = await new Redlock([redis], { retryDelay: 50 }).acquire(["{redlock}c"], LONG).catch((x: unknown) => x);
      assert.ok(e instanceof ExecutionError);
      assert.ok(Date.now() - t0 >= 450, "it waited as long as the retries would have (10 x 50 ms)");
      assert.equal(e.attempts.length, 2, "the try, then the wait");
      for (const v of await votes(e)) assert.ok(v instanceof ResourceLockedError, "The error must be a ResourceLockedError.");
      await lock.release();
      assert.equal(await info(redis, "{redlock}c"), null);
    });

    it("overlapping multi-locks are exclusive", async () => {
      const redlock = new Redlock([redis], { retryCount: 0 });
      const lock = await redlock.acquire(["{redlock}c1", "{redlock}c2"], LONG);
      const e = await redlock.acquire(["{redlock}c2", "{redlock}c3"], LONG).catch((x: unknown) => x);
      assert.ok(e instanceof ExecutionError);
      assert.equal(await tokenOf(redis, "{redlock}c1"), lock.token, "The original lock value must not be changed.");
      assert.equal(await tokenOf(redis, "{redlock}c2"), lock.token);
      assert.equal(await info(redis, "{redlock}c3"), null, "The new resource must remain unlocked.");
      for (const v of await votes(e)) assert.ok(v instanceof ResourceLockedError);
      await lock.release();
      for (const k of ["{redlock}c1", "{redlock}c2", "{redlock}c3"]) assert.equal(await info(redis, k), null);
    });

    it("the `using` helper acquires, extends, and releases locks", async () => {
      const redlock = new Redlock([redis]);
      const value = await redlock.using(["{redlock}x"], 500, { automaticExtensionThreshold: 200 }, async (signal) => {
        const token = await tokenOf(redis, "{redlock}x");
        assert.equal(typeof token, "number");
        await sleep(700);
        assert.equal(signal.aborted, false, "The signal must not be aborted.");
        assert.equal(signal.error, undefined, "The signal must not have an error.");
        assert.equal(await tokenOf(redis, "{redlock}x"), token, "The lock value should not have changed.");
        return token;
      });
      assert.equal(typeof value, "number");
      assert.equal(await info(redis, "{redlock}x"), null, "The lock was not released.");
    });

    it("the `using` helper is exclusive, and aborts its signal when the lock is lost", async () => {
      const redlock = new Redlock([redis]);
      let locked = false;
      const routine = async (signal: AbortSignal & { error?: Error }): Promise<number | null> => {
        assert.equal(locked, false, "The resource must not already be locked.");
        locked = true;
        const token = await tokenOf(redis, "{redlock}y");
        await sleep(700);
        assert.equal(signal.error, undefined);
        assert.equal(signal.aborted, false);
        locked = false;
        return token;
      };
      const [a, b] = await Promise.all([
        redlock.using(["{redlock}y"], 500, { automaticExtensionThreshold: 200 }, routine),
        redlock.using(["{redlock}y"], 500, { automaticExtensionThreshold: 200 }, routine),
      ]);
      assert.notEqual(a, b, "The locks must be different.");
      assert.equal(await info(redis, "{redlock}y"), null);
      await redlock.using(["{redlock}y"], LONG, async (signal) => {
        await (redis as IORedis).del("{redlock}y");
        await new Promise((resolve) => signal.addEventListener("abort", resolve));
        assert.ok(signal.error instanceof ExecutionError);
      });
    });
  });
}

function multi(kind: string): void {
  describe(`node-redlock v5's multi.test.ts on the drop-in: three ${kind} masters`, () => {
    let servers: Server[];
    let clients: IORedis[];
    before(async () => {
      servers = await Promise.all([0, 1, 2].map(() => Server.start(kind)));
      clients = await Promise.all(servers.map((s) => new IORedis(s.port, "127.0.0.1")));
    });
    after(async () => {
      clients.forEach((c) => c.disconnect());
      await Promise.all(servers.map((s) => s.close()));
    });

    it("acquires, extends, and releases a single lock (any duration)", async () => {
      const redlock = new Redlock(clients);
      let lock = await redlock.acquire(["{redlock}a"], LONG);
      for (const c of clients) assert.equal(await tokenOf(c, "{redlock}a"), lock.token);
      lock = await lock.extend(3 * LONG);
      for (const c of clients) assert.equal(await tokenOf(c, "{redlock}a"), lock.token);
      await lock.release();
      for (const c of clients) assert.equal(await info(c, "{redlock}a"), null);
    });

    it("succeeds when a minority of clients fail", async () => {
      const redlock = new Redlock(clients);
      await clients[2].set("{redlock}b", "other");
      let lock = await redlock.acquire(["{redlock}b"], LONG);
      const stats = await lock.attempts[0];
      assert.equal(stats.votesFor.size, 2);
      assert.ok(stats.votesAgainst.get(clients[2]) instanceof ResourceLockedError, "a key of another type is held by another");
      assert.equal(await tokenOf(clients[0], "{redlock}b"), lock.token);
      assert.equal(await tokenOf(clients[1], "{redlock}b"), lock.token);
      assert.equal(await clients[2].get("{redlock}b"), "other", "The lock value was changed.");
      assert.equal(await clients[2].pttl("{redlock}b"), -1, "The lock expiration was changed");
      lock = await lock.extend(3 * LONG);
      assert.equal(await clients[2].get("{redlock}b"), "other");
      await lock.release();
      assert.equal(await info(clients[0], "{redlock}b"), null);
      assert.equal(await clients[2].get("{redlock}b"), "other");
      await clients[2].del("{redlock}b");
    });

    it("fails when a majority of clients fail: 11 attempts of ResourceLockedError votes", async () => {
      const redlock = new Redlock(clients, { retryDelay: 20, retryJitter: 5 });
      await clients[1].set("{redlock}c", "other1");
      await clients[2].set("{redlock}c", "other2");
      const e = await redlock.acquire(["{redlock}c"], LONG).catch((x: unknown) => x);
      assert.ok(e instanceof ExecutionError);
      assert.equal(e.attempts.length, 11, "A failed acquisition must have the configured number of retries.");
      assert.equal(await info(clients[0], "{redlock}c"), null, "released where it was granted");
      assert.equal(await clients[1].get("{redlock}c"), "other1");
      assert.equal(await clients[2].get("{redlock}c"), "other2");
      const against = await votes(e);
      assert.equal(against.length, 22);
      for (const v of against) {
        assert.ok(v instanceof ResourceLockedError);
        assert.equal(v.message, "The operation was applied to: 0 of the 1 requested resources.");
      }
      await clients[1].del("{redlock}c");
      await clients[2].del("{redlock}c");
    });

    it("a server error reaches the caller as the votes of an ExecutionError, not raw", async () => {
      // A user that may not run LEASE.ACQUIRE: every master answers NOPERM.
      for (const c of clients) await c.call("ACL", "SETUSER", "noperm", "on", "nopass", "+@all", "-lease.acquire");
      const users = servers.map((s) => new IORedis({ host: "127.0.0.1", port: s.port, username: "noperm", password: "x" }));
      try {
        const redlock = new Redlock(users, { retryCount: 2, retryDelay: 10 });
        const events: Error[] = [];
        redlock.on("error", (x: Error) => events.push(x));
        const e = await redlock.acquire(["{redlock}e"], 1000).catch((x: unknown) => x);
        assert.ok(e instanceof ExecutionError, `an ExecutionError, not ${String(e)}`);
        assert.equal(e.attempts.length, 3);
        const against = await votes(e);
        assert.equal(against.length, 9);
        for (const v of against) assert.match(v.message, /^NOPERM/);
        assert.equal(events.length, 9);
        const one = await new Redlock([users[0]], { retryCount: 1, retryDelay: 10 }).acquire(["{redlock}e"], 1000).catch((x: unknown) => x);
        assert.ok(one instanceof ExecutionError);
        assert.equal(one.attempts.length, 2);
      } finally {
        users.forEach((u) => u.disconnect());
      }
    });
  });
}

for (const kind of KINDS) {
  single(`one ${kind} server`, async () => {
    const server = await Server.start(kind);
    const redis = new IORedis(server.port, "127.0.0.1");
    return {
      redis,
      async stop() {
        redis.disconnect();
        await server.close();
      },
      async maxTtl(ms: number) {
        if (!FULL(kind)) return false;
        return redis.call("CONFIG", "SET", "lease.max-ttl-ms", String(ms)).then(
          () => true,
          () => false,
        );
      },
    };
  });
  multi(kind);
}

// And on a cluster, as node-redlock's tests run each file twice.
single(`a three-master ${KINDS[0]} cluster`, async () => {
  const nodes = await ClusterNodes.start(KINDS[0]);
  const redis = new IOCluster(nodes.ports.map((port) => ({ host: "127.0.0.1", port })));
  return {
    redis,
    async stop() {
      redis.disconnect();
      await nodes.close();
    },
    async maxTtl() {
      return false;
    },
  };
});
