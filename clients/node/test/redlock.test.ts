// The node-redlock drop-in against real servers: every server kind, both
// client libraries, one master and three; and one scenario run unchanged on
// node-redlock itself and on the drop-in (the one import that changes).

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import NodeRedlock from "redlock";

import Redlock, { ExecutionError, Lock, ResourceLockedError } from "../src/redlock";
import { LeaseLost, StaleToken } from "../src";
import { KINDS, LIBS, Server, leaseInfo, raw, sleep } from "./servers";

for (const kind of KINDS) {
  for (const lib of LIBS) {
    describe(`Redlock drop-in on ${kind} with ${lib.name}`, { concurrency: true }, () => {
      let server: Server;
      let conn: object;
      let r: Awaited<ReturnType<typeof raw>>;
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

      it("acquire gives node-redlock's Lock plus a token and a fence; extend and release", async () => {
        const redlock = new Redlock([conn], { retryCount: 0 });
        const t0 = Date.now();
        const lock = await redlock.acquire(["a"], 5000);
        assert.ok(lock instanceof Lock);
        assert.deepEqual(lock.resources, ["a"]);
        assert.match(lock.value, /^[0-9a-f]{32}$/);
        assert.ok(lock.expiration > t0 + 4900 && lock.expiration <= Date.now() + 5000);
        assert.equal(lock.attempts.length, 1);
        const stats = await lock.attempts[0];
        assert.equal(stats.votesFor.size, 1);
        assert.ok(lock.token > 0);
        assert.equal(Number((await leaseInfo(r, "a"))!.token), lock.token);
        assert.equal(await lock.fence("SET", "a:data", "1"), "OK");
        const longer = await lock.extend(20000);
        assert.equal(lock.expiration, 0, "the old lock is invalidated");
        assert.ok(Number((await leaseInfo(r, "a"))!.ttl) > 10000);
        assert.equal(longer.token, lock.token);
        await longer.release();
        assert.equal(await leaseInfo(r, "a"), null);
        await assert.rejects(longer.release(), ExecutionError, "a second release finds nothing");
        await assert.rejects(longer.fence("SET", "a:data", "2"), StaleToken);
      });

      it("contention is an ExecutionError whose votes are ResourceLockedErrors, and an error event", async () => {
        const holder = await new Redlock([conn]).acquire(["b"], 5000);
        const redlock = new Redlock([conn], { retryCount: 0 });
        const events: Error[] = [];
        redlock.on("error", (e: Error) => events.push(e));
        const e = await redlock.acquire(["b"], 5000).catch((x: unknown) => x);
        assert.ok(e instanceof ExecutionError);
        const stats = await e.attempts[0];
        assert.ok([...stats.votesAgainst.values()][0] instanceof ResourceLockedError);
        assert.ok(events[0] instanceof ResourceLockedError);
        await holder.release();
      });

      it("retries are a wait on the server: the lock comes when the holder releases", async () => {
        const holder = await new Redlock([conn]).acquire(["c"], 5000);
        const redlock = new Redlock([conn], { retryCount: 10, retryDelay: 100 });
        const waiting = redlock.acquire(["c"], 5000);
        await sleep(200);
        const t = Date.now();
        await holder.release();
        const lock = await waiting;
        assert.ok(Date.now() - t < 100, "handed over at the release, not at a retry");
        assert.ok(lock.token > holder.token);
        await lock.release();
      });

      it("several resources on one master: all or nothing under one token", async () => {
        const redlock = new Redlock([conn], { retryCount: 0 });
        const other = await redlock.acquire(["d2"], 5000);
        await assert.rejects(redlock.acquire(["d1", "d2"], 5000), ExecutionError);
        assert.equal(await leaseInfo(r, "d1"), null, "nothing taken in part");
        await other.release();
        const lock = await redlock.acquire(["d1", "d2"], 5000);
        assert.deepEqual(lock.tokens, [lock.token, lock.token]);
        assert.equal(await lock.fenceOn("d2", "SET", "d:data", "x"), "OK");
        await lock.release();
        assert.equal(await leaseInfo(r, "d1"), null);
        assert.equal(await leaseInfo(r, "d2"), null);
      });

      it("using renews while the routine runs and aborts its signal when the lock is lost", async () => {
        const redlock = new Redlock([conn]);
        const value = await redlock.using(["e"], 600, async (signal) => {
          await sleep(900);
          assert.equal(signal.aborted, false, "renewed past its duration");
          return 7;
        });
        assert.equal(value, 7);
        assert.equal(await leaseInfo(r, "e"), null, "released after");
        await redlock.using(["e"], 600, { retryCount: 0 }, async (signal) => {
          await r.del("e");
          await new Promise((resolve) => signal.addEventListener("abort", resolve));
          assert.ok(signal.error instanceof ExecutionError);
          assert.equal((signal.reason as LeaseLost).loss, "refused");
        });
        await assert.rejects(redlock.using(["e"], 500, async () => 1), /at least 100ms greater/);
      });
    });
  }

  describe(`Redlock drop-in on three ${kind} masters (quorum)`, () => {
    let servers: Server[];
    let conns: object[];
    before(async () => {
      servers = await Promise.all([0, 1, 2].map(() => Server.start(kind)));
      conns = await Promise.all(servers.map((s, i) => LIBS[i % 2].connect(s.port)));
    });
    after(async () => {
      await Promise.all(conns.map((c, i) => LIBS[i % 2].close(c)));
      await Promise.all(servers.map((s) => s.close()));
    });

    it("one token committed on the masters, several resources all or nothing, released everywhere", async () => {
      const redlock = new Redlock(conns, { retryCount: 0 });
      const lock = await redlock.acquire(["q1", "q2"], 5000);
      const stats = await lock.attempts[0];
      assert.ok(stats.votesFor.size >= 2);
      const r = await raw(servers[0].port);
      try {
        assert.equal(Number((await leaseInfo(r, "q1"))!.token), lock.tokens[0]);
        assert.equal(await lock.fence("INCR", "q1:n"), 1);
        await assert.rejects(redlock.acquire(["q2"], 5000), ExecutionError);
        await lock.release();
        assert.equal(await leaseInfo(r, "q1"), null);
        const next = await redlock.acquire(["q1"], 5000);
        assert.ok(next.token > lock.tokens[0]);
        await next.release();
      } finally {
        r.disconnect();
      }
    });
  });
}

// The same user code on node-redlock and on the drop-in: only the import
// (the constructor) differs. node-redlock needs ioredis.
describe("one scenario, unchanged, on node-redlock and on the drop-in", () => {
  let server: Server;
  before(async () => {
    server = await Server.start(KINDS[0]);
  });
  after(async () => server.close());

  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  async function scenario(RedlockClass: any): Promise<string[]> {
    const client = await LIBS[0].connect(server.port);
    const key = "scenario";
    const seen: string[] = [];
    try {
      const redlock = new RedlockClass([client], { retryCount: 0, driftFactor: 0.01, retryDelay: 50, retryJitter: 10, automaticExtensionThreshold: 100 });
      redlock.on("error", () => undefined);
      const lock = await redlock.acquire([key], 2000);
      seen.push(`resources=${lock.resources.join(",")}`, `value=${typeof lock.value}`, `attempts=${lock.attempts.length}`);
      seen.push(`expiration-ok=${lock.expiration > Date.now() && lock.expiration <= Date.now() + 2000}`);
      try {
        await redlock.acquire([key], 2000);
        seen.push("second acquire: ok");
      } catch (e) {
        seen.push(`second acquire: ${(e as Error).name}`);
        const stats = await (e as ExecutionError).attempts[0];
        seen.push(`vote: ${[...stats.votesAgainst.values()][0]?.name}`);
      }
      const extended = await lock.extend(3000);
      seen.push(`extended-old-expiration=${lock.expiration}`, `extended-new=${extended.expiration > Date.now() + 2000}`);
      const result = await extended.release();
      seen.push(`release attempts=${result.attempts.length}`);
      const r = await redlock.using([key], 500, async (signal: AbortSignal) => `using:${signal.aborted}`);
      seen.push(String(r));
      return seen;
    } finally {
      await LIBS[0].close(client);
    }
  }

  it("node-redlock and the drop-in behave the same", async () => {
    const theirs = await scenario(NodeRedlock);
    const ours = await scenario(Redlock);
    assert.deepEqual(ours, theirs);
  });
});

// A master that answers after the majority decided: node-redlock resolves
// the acquire and the release at the majority and counts the late vote in
// its stats when it comes, with no "error" event; the drop-in the same.
describe("a late master's vote, on node-redlock and on the drop-in", () => {
  let servers: Server[];
  before(async () => {
    servers = await Promise.all([0, 1, 2, 3, 4].map(() => Server.start(KINDS[0])));
  });
  after(async () => Promise.all(servers.map((s) => s.close())));

  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  async function lateVotes(RedlockClass: any, key: string): Promise<string[]> {
    const conns = await Promise.all(servers.map((s) => LIBS[0].connect(s.port)));
    const pauser = await raw(servers[4].port);
    const seen: string[] = [];
    try {
      const redlock = new RedlockClass(conns, { retryCount: 0, driftFactor: 0.01 });
      const errors: Error[] = [];
      redlock.on("error", (e: Error) => errors.push(e));
      // Master 4 holds every write command (LEASE.ACQUIRE, EVALSHA) for
      // 150 ms: the other four decide the acquire without it.
      const late = async <T>(op: () => Promise<T>): Promise<[T, number]> => {
        await pauser.call("CLIENT", "PAUSE", "150", "WRITE");
        const t0 = Date.now();
        const r = await op();
        return [r, Date.now() - t0];
      };
      const [lock, acquireMs] = await late((): Promise<Lock> => redlock.acquire([key], 5000));
      seen.push(`acquire returned before the late master: ${acquireMs < 120}`);
      const stats = await lock.attempts[0];
      seen.push(`acquire votes for=${stats.votesFor.size} against=${stats.votesAgainst.size}`);
      const [result, releaseMs] = await late(() => lock.release());
      seen.push(`release returned before the late master: ${releaseMs < 120}`);
      const released = await result.attempts[0];
      seen.push(`release votes for=${released.votesFor.size} against=${released.votesAgainst.size}`);
      seen.push(`error events=${errors.length}`);
      return seen;
    } finally {
      pauser.disconnect();
      await Promise.all(conns.map((c) => LIBS[0].close(c)));
    }
  }

  it("the acquire and the release return at the majority; the late vote is a vote for, no error event", async () => {
    const theirs = await lateVotes(NodeRedlock, "late-theirs");
    assert.deepEqual(theirs, [
      "acquire returned before the late master: true",
      "acquire votes for=5 against=0",
      "release returned before the late master: true",
      "release votes for=5 against=0",
      "error events=0",
    ]);
    assert.deepEqual(await lateVotes(Redlock, "late-ours"), theirs);
  });
});
