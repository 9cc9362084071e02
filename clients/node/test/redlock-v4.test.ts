// The node-redlock v4 drop-in beyond what node-redlock v4.2.0's own test.js
// checks (make node-test runs that file against it too:
// test/redlock-v4/run.sh): its tokens and fence, a wait on the server longer
// than the lock's ttl, any duration, a name held by a key of another type,
// an unreachable server, and a lock released by name. On real servers,
// with ioredis 5 and node-redis 5 clients (v4's own test uses ioredis 4 and
// node_redis v3).

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import IORedis from "ioredis";

// The v4 entry is CommonJS (`export =`), imported as its users require it.
// eslint-disable-next-line @typescript-eslint/no-require-imports
import Redlock = require("../src/redlock-v4");
import { StaleToken } from "../src";
import { KINDS, LIBS, Server, leaseInfo, raw, sleep } from "./servers";

for (const lib of LIBS) {
  describe(`Redlock v4 drop-in on ${KINDS[0]} with ${lib.name}`, () => {
    let server: Server;
    let conn: object;
    let r: IORedis;
    before(async () => {
      server = await Server.start(KINDS[0]);
      conn = await lib.connect(server.port);
      r = await raw(server.port);
    });
    after(async () => {
      await lib.close(conn);
      r.disconnect();
      await server.close();
    });

    it("a lock has a fencing token and a fence; unlock at once, then the fence is refused", async () => {
      const redlock = new Redlock([conn], { retryCount: 0 });
      const lock = await redlock.lock("t", 5000);
      assert.ok(lock instanceof Redlock.Lock);
      assert.equal(Number((await leaseInfo(r, "t"))!.token), lock.token);
      assert.equal(await lock.fence("SET", "t:data", "1"), "OK");
      const p = lock.unlock();
      assert.equal(lock.expiration, 0);
      await p;
      await assert.rejects(lock.fence("SET", "t:data", "2"), StaleToken);
      const again = await new Promise<InstanceType<typeof Redlock.Lock>>((resolve, reject) => redlock.lock(["t1", "t2"], 5000, (e, l) => (e ? reject(e) : resolve(l!))));
      assert.deepEqual(again.tokens, [again.token, again.token]);
      await again.unlock();
    });

    it("a lock granted after a wait longer than its ttl counts from its grant", async () => {
      const holder = await new Redlock([conn], { retryCount: 0 }).lock("w", 5000);
      const redlock = new Redlock([conn], { retryCount: 30, retryDelay: 100 });
      const waiting = redlock.lock("w", 300);
      await sleep(800);
      await holder.unlock();
      const lock = await waiting;
      assert.ok(lock.expiration > Date.now() + 200, "its expiration is 300 ms after the grant");
      assert.ok(lock.attempts > 1 && lock.attempts <= 31);
      assert.equal(Number((await leaseInfo(r, "w"))!.token), lock.token);
      await lock.unlock();
    });

    it("any duration: the server lease is renewed until the lock's end", async () => {
      await r.call("CONFIG", "SET", "lease.max-ttl-ms", "600");
      try {
        const redlock = new Redlock([conn], { retryCount: 0 });
        const lock = await redlock.lock("long", Math.floor(Number.MAX_SAFE_INTEGER / 10));
        assert.ok(Number((await leaseInfo(r, "long"))!.ttl) <= 600);
        await sleep(1000);
        assert.equal(Number((await leaseInfo(r, "long"))!.token), lock.token, "still held past its server lease");
        await lock.extend(1000);
        await sleep(1300);
        assert.equal(await leaseInfo(r, "long"), null, "extended to 1 s: it ended there");
      } finally {
        await r.call("CONFIG", "SET", "lease.max-ttl-ms", "60000");
      }
    });

    it("a name held by a key of another type: clientError events and a LockError after retryCount + 1 attempts", async () => {
      await r.sadd("set", "x");
      const redlock = new Redlock([conn], { retryCount: 2, retryDelay: 20, retryJitter: 0 });
      const errors: Error[] = [];
      redlock.on("clientError", (e: Error) => errors.push(e));
      let unhandled = 0;
      redlock.on("error", () => (unhandled += 1));
      const e = await redlock.lock("set", 1000).catch((x: unknown) => x);
      assert.ok(e instanceof Redlock.LockError);
      assert.equal((e as InstanceType<typeof Redlock.LockError>).attempts, 3);
      assert.equal(errors.length, 3);
      for (const x of errors) assert.match(x.message, /^WRONGTYPE/);
      assert.equal(unhandled, 0, "never an error event");
      await r.del("set");
    });

    it("a lock rebuilt from its resource and value is released by name", async () => {
      const redlock = new Redlock([conn], { retryCount: 0 });
      const lock = await redlock.lock("named", 5000);
      const rebuilt = new Redlock.Lock(redlock, "named", lock.value, Date.now() + 5000, 1, 0);
      await rebuilt.unlock();
      assert.equal(await leaseInfo(r, "named"), null);
      await assert.rejects(lock.unlock(), Redlock.LockError, "the original finds nothing to release");
    });
  });
}

describe("Redlock v4 drop-in: an unreachable server", () => {
  it("is clientError events, never an error event, and a LockError", async () => {
    const down = await Server.start(KINDS[0]);
    const port = down.port;
    await down.close();
    const c = new IORedis({ host: "127.0.0.1", port, maxRetriesPerRequest: 0, retryStrategy: () => null });
    c.on("error", () => undefined);
    const redlock = new Redlock([c], { retryCount: 2, retryDelay: 10 });
    const errors: Error[] = [];
    redlock.on("clientError", (e: Error) => errors.push(e));
    const e = await redlock.lock("x", 1000).catch((x: unknown) => x);
    assert.ok(e instanceof Redlock.LockError);
    assert.equal(errors.length, 3);
    for (const x of errors) assert.equal(x.message, "Connection is closed.");
    c.disconnect();
  });
});
