// The I/O-free core on its own (no server needed): the decisions the
// clients take.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import {
  Commit,
  FAILED,
  Held,
  LeaseExpiring,
  NOT_IN,
  Proposer,
  ReplyTimeout,
  StaleToken,
  acquireArgs,
  checkStale,
  defaultLabel,
  fenceArgs,
  fencedReply,
  firstOutcome,
  graceOf,
  keySlot,
  labelArgs,
  labelOf,
  macquireArgs,
  parseWaiters,
  releaseOutcome,
  renewOutcome,
  truncateLabel,
  waitersArgs,
  withBlock,
} from "../src/core";

describe("core", () => {
  it("labels: cut to 256 bytes on a character boundary, null or false for none, undefined inherits", () => {
    assert.equal(truncateLabel(Buffer.alloc(300, "x")).length, 256);
    for (let pad = 0; pad < 4; pad++) {
      const cut = truncateLabel(Buffer.concat([Buffer.alloc(pad, "x"), Buffer.from("€".repeat(100))]));
      assert.ok(cut.length <= 256 && cut.length > 252);
      assert.equal(Buffer.from(cut.toString()).length, cut.length, "never a broken character");
    }
    assert.equal(labelOf("é".repeat(200)), "é".repeat(128));
    assert.equal(labelOf(null, "client's"), null);
    assert.equal(labelOf(false), null);
    assert.equal(labelOf(""), null);
    assert.equal(labelOf(undefined, "client's"), "client's");
    assert.equal(labelOf(undefined, null), null, "a client without a label");
    assert.equal(labelOf(undefined), defaultLabel());
    assert.equal(defaultLabel(), defaultLabel());
    assert.ok(Buffer.byteLength(defaultLabel()) <= 256 && defaultLabel().includes(` pid ${process.pid} `));
    assert.throws(() => labelOf(1 as unknown as string), TypeError);
    // LABEL goes before BLOCK, the same on every attempt.
    const base = acquireArgs("k", "o", 1000, ["SHARED"], labelArgs("l"));
    const [args] = withBlock(base, 500, performance.now() + 500, 5000, 2000);
    assert.deepEqual(args.slice(0, 8), ["LEASE.ACQUIRE", "k", "o", 1000, "SHARED", "LABEL", "l", "BLOCK"]);
    assert.deepEqual(macquireArgs(["a", "b"], "o", 1000, labelArgs(null)), ["LEASE.MACQUIRE", 2, "a", "b", "o", 1000]);
  });

  it("the waiters' reply in RESP2 and RESP3", () => {
    const flat = ["client", 7, "label", Buffer.from("w"), "mode", "keys", "limit", 0, "keys", 2, "waited", 15, "timeout", -1];
    const map = new Map<string, unknown>([["client", 8], ["label", null], ["mode", "limit"], ["limit", 3], ["keys", 1], ["waited", 0], ["timeout", 250]]);
    const obj = { client: 9, label: "o", mode: "shared", limit: 0, keys: 1, waited: 1, timeout: 2 };
    assert.deepEqual(parseWaiters([flat, map, obj]), [
      { client: 7, label: "w", mode: "keys", limit: 0, keys: 2, waitedMs: 15, timeoutMs: null },
      { client: 8, label: null, mode: "limit", limit: 3, keys: 1, waitedMs: 0, timeoutMs: 250 },
      { client: 9, label: "o", mode: "shared", limit: 0, keys: 1, waitedMs: 1, timeoutMs: 2 },
    ]);
    assert.deepEqual(parseWaiters([]), []);
    assert.deepEqual(waitersArgs("k"), ["LEASE.WAITERS", "k"]);
    assert.deepEqual(waitersArgs("k", 5), ["LEASE.WAITERS", "k", "COUNT", 5]);
    for (const bad of [0, 1001, 2.5]) assert.throws(() => waitersArgs("k", bad), RangeError);
  });

  it("keySlot is Redis Cluster's slot, hash tags included", () => {
    assert.equal(keySlot("123456789"), 0x31c3);
    assert.equal(keySlot("foo"), 12182);
    assert.equal(keySlot("{foo}:lock"), keySlot("foo"));
  });

  it("a BLOCK wait asks for what is left of it, never BLOCK 0 at its end", () => {
    const [args, timeout] = withBlock(["LEASE.ACQUIRE", "k", "o", 1000], 500, performance.now() + 500, 5000, 2000);
    assert.equal(args[4], "BLOCK");
    assert.ok(Number(args[5]) <= 500 && timeout! >= 2000);
    assert.deepEqual(withBlock(["X"], 500, performance.now() - 1, 5000, 2000), [["X"], 5000]);
    assert.deepEqual(withBlock(["X"], 0, undefined, 5000, 2000), [["X", "BLOCK", 0], null]);
  });

  it("grace comes from INFO lease", () => {
    assert.deepEqual(graceOf("# lease\r\nlease_grace_remaining_ms:1200\r\nlease_grace_reason:promoted\r\n"), [1200, "promoted"]);
    assert.equal(graceOf("lease_grace_remaining_ms:0\r\n"), null);
  });

  it("fence arguments put MINTTL right after the token, and EXPIRING is LeaseExpiring", () => {
    assert.deepEqual(fenceArgs("k", 7, ["SET", "x", 1]), ["LEASE.FENCE", "k", 7, "SET", "x", 1]);
    assert.deepEqual(fenceArgs("k", 7, [{ minTtlMs: 500 }]), ["LEASE.FENCE", "k", 7, "MINTTL", 500]);
    assert.deepEqual(fenceArgs("k", 7, [{ minTtlMs: 0 }, "GET", "x"]), ["LEASE.FENCE", "k", 7, "MINTTL", 0, "GET", "x"]);
    assert.deepEqual(fenceArgs("k", 7, [Buffer.from("GET"), "x"]), ["LEASE.FENCE", "k", 7, Buffer.from("GET"), "x"]);
    class ReplyError extends Error {}
    const expiring = (left: number) => new ReplyError(`EXPIRING lease has ${left} ms left, less than MINTTL 500`);
    const stale = () => new ReplyError("STALE fencing token is not the token of the lease held on this key");
    const e = checkStale(expiring(120));
    assert.ok(e instanceof LeaseExpiring && e.leftMs === 120 && e.minTtlMs === 500);
    assert.throws(() => fencedReply([expiring(120), expiring(130), stale()], 2), (x: unknown) => x instanceof LeaseExpiring && x.leftMs === 120);
    assert.equal(fencedReply([1, expiring(1), 2], 2), 1);
    assert.throws(() => fencedReply([1, expiring(1), stale()], 2), LeaseExpiring);
    assert.throws(() => fencedReply([expiring(1), stale(), stale()], 2), StaleToken);
  });

  it("a quorum commit needs a majority answering exactly the token", () => {
    const c = Commit.first([
      [0, 10],
      [1, 12],
    ], 2)!;
    assert.equal(c.token, 12);
    assert.deepEqual(c.decide([12, 12], String), [0, 1]);
    assert.equal(c.decide([12, 13], String), FAILED);
    assert.equal(renewOutcome([1, 1, undefined], 3), true);
    assert.equal(renewOutcome([0, 0, undefined], 3), false);
    assert.equal(renewOutcome([1, 0, undefined], 3), null);
  });

  // The same cases as the Python helper's tests/test_protocol.py.
  it("step 1 holds on an exact majority of the proposal as soon as it is in", () => {
    const on = [0, 1, 2, 3, 4];
    const timeout = new ReplyTimeout("no reply");
    // Three exact answers decide it; the two others are not waited for.
    assert.deepEqual(firstOutcome(500, on, [500, NOT_IN, 500, NOT_IN, 500], 3), new Held(500, [0, 2, 4]));
    assert.equal(firstOutcome(500, on, [500, NOT_IN, 500, NOT_IN, 900], 3), null);
    // Exactness cannot come any more: step 3 with the grants in so far.
    const commit = firstOutcome(500, on, [500, 700, 900, 800, NOT_IN], 3);
    assert.ok(commit instanceof Commit && commit.token === 900);
    assert.deepEqual(commit.on, [0, 1, 2, 3]);
    assert.equal(firstOutcome(500, on, [null, timeout, NOT_IN, null, 500], 3), FAILED);
    // A majority of different tokens is step 3, never held with them.
    assert.ok(firstOutcome(500, on, [600, 700, 800, null, null], 3) instanceof Commit);
  });

  it("a commit round and a release are decided by a majority", () => {
    class ReplyError extends Error {}
    const far = new ReplyError("ERR FLOOR is 400 days ahead of this server's clock");
    const commit = Commit.first([
      [0, 9],
      [1, 5],
      [2, 7],
      [3, 8],
      [4, 6],
    ], 3)!;
    assert.deepEqual(commit.decide([9, NOT_IN, 9, 9, NOT_IN], String), [0, 2, 3]);
    assert.equal(commit.decide([9, NOT_IN, 9, NOT_IN, NOT_IN], String), null);
    const timeout = new ReplyTimeout("no reply");
    assert.equal(commit.decide([9, timeout, timeout, timeout, NOT_IN], String), FAILED);
    const again = commit.decide([9, far, far, far, NOT_IN], String);
    assert.ok(Array.isArray(again) && again[0] instanceof Commit);
    assert.equal((again[0] as Commit).token, 8);
    assert.deepEqual((again[0] as Commit).on, [1, 2, 3]);
    assert.equal(releaseOutcome([1, NOT_IN, 1, 1, NOT_IN], 5), true);
    assert.equal(releaseOutcome([1, NOT_IN, 0, timeout, 0], 5), false);
    assert.equal(releaseOutcome([1, NOT_IN, 0, 1, NOT_IN], 5), null);
  });

  it("proposals follow the majority's clocks and stay above the previous one", () => {
    const ms = 1024;
    let p = new Proposer();
    const t = 1_000_000;
    const a = p.propose(t, 7);
    assert.equal(a, (t + 20) * ms + 8, "20 ms ahead, low bits 1 to 255");
    const b = p.propose(t, 0);
    assert.equal(b, a + 1, "within the same ms: above the previous proposal");
    p.learn(t, b, [b, (t + 5000) * ms, (t + 5001) * ms, (t + 5002) * ms, b]);
    assert.equal(p.offsetMs, 5000);
    assert.ok(p.propose(t + 1, 0) > (t + 5002) * ms);
    // One master 400 days ahead (an outlier) does not move it.
    p = new Proposer();
    const c = p.propose(t, 0);
    p.learn(t, c, [(t + 400 * 86_400_000) * ms, c, c, c, NOT_IN]);
    assert.equal(p.offsetMs, 0);
    // A majority behind (step 1 without FLOOR after refusing the proposal).
    p.learn(t, c, [(t - 3000) * ms, (t - 3000) * ms, (t - 3000) * ms, c, NOT_IN]);
    assert.equal(p.offsetMs, -3000);
  });
});
