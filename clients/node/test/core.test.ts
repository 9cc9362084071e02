// The I/O-free core on its own (no server needed): the decisions the
// clients take.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import {
  Commit,
  LeaseExpiring,
  StaleToken,
  acquireArgs,
  checkStale,
  defaultLabel,
  fenceArgs,
  fencedReply,
  graceOf,
  keySlot,
  labelArgs,
  labelOf,
  macquireArgs,
  parseWaiters,
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
    const c = Commit.first([10, 12, null], 2)!;
    assert.equal(c.token, 12);
    assert.deepEqual(c.settle([12, 12], String), [0, 1]);
    assert.equal(c.settle([12, 13], String), null);
    assert.equal(renewOutcome([1, 1, undefined], 3), true);
    assert.equal(renewOutcome([0, 0, undefined], 3), false);
    assert.equal(renewOutcome([1, 0, undefined], 3), null);
  });
});
