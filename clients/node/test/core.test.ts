// The I/O-free core on its own (no server needed): the decisions the
// clients take.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { Commit, graceOf, keySlot, renewOutcome, withBlock } from "../src/core";

describe("core", () => {
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
