// The helper and the drop-in on a real Redis Cluster (three masters), with
// both client libraries. A cluster takes a few seconds to form: it runs on
// the first server kind and on Valkey 9.1 when present.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { LeaseClient, Redlock, keySlot } from "../src";
import { ClusterNodes, KINDS, LIBS, leaseInfo, raw, sleep } from "./servers";

const CLUSTER_KINDS = [...new Set([KINDS[0], ...KINDS.filter((k) => k === "valkey91")])];

/** A key whose slot is served by each third of the slot range (the three
 * masters of `redis-cli --cluster create`). */
function keysOnEveryMaster(): string[] {
  const out: string[] = [];
  for (const [lo, hi] of [[0, 5460], [5461, 10922], [10923, 16383]]) {
    for (let i = 0; i < 100000; i++) {
      const s = keySlot(`{t${i}}`);
      if (s >= lo && s <= hi) {
        out.push(`{t${i}}`);
        break;
      }
    }
  }
  return out;
}

for (const kind of CLUSTER_KINDS) {
  describe(`cluster of three ${kind} masters`, () => {
    let cluster: ClusterNodes;
    before(async () => {
      cluster = await ClusterNodes.start(kind);
    });
    after(async () => cluster.close());

    for (const lib of LIBS) {
      it(`${lib.name}: leases on every master, fenced, renewed in one pipeline per node, multi-key in one slot, blocking`, async () => {
        const conn = await lib.cluster(cluster.ports);
        const client = new LeaseClient(conn);
        try {
          const tags = keysOnEveryMaster();
          const leases = await Promise.all(tags.map((t) => client.acquire(`${t}:${lib.name}:lock`, 300)));
          for (const [n, l] of leases.entries()) {
            assert.ok(l);
            assert.equal(await l.fence("SET", `${tags[n]}:${lib.name}:data`, "v"), "OK");
          }
          await sleep(700);
          for (const l of leases) assert.equal(l!.lost, false);
          const stats = client.watchdogStats();
          assert.ok(stats.renewals >= 6 && stats.roundTrips <= stats.renewals, JSON.stringify(stats));
          await Promise.all(leases.map((l) => l!.release()));

          const keys = [`{m}:${lib.name}:a`, `{m}:${lib.name}:b`];
          const many = await client.acquireMany(keys, 5000);
          assert.ok(many);
          assert.equal(await many.fence(keys[1], "SET", `{m}:${lib.name}:data`, "1"), "OK");
          await many.release();
          await assert.rejects(client.acquireMany([`{x}:${lib.name}`, `{y}:${lib.name}`], 5000), /CROSSSLOT/);

          const key = `${tags[1]}:${lib.name}:wait`;
          const holder = await client.acquire(key, 5000);
          const other = new LeaseClient(conn);
          const waiting = other.acquire(key, 5000, { blockMs: 3000 });
          await sleep(100);
          await holder!.release();
          const got = await waiting;
          assert.ok(got && got.token > holder!.token);
          await got.release();
          await other.close();

          const redlock = new Redlock([conn], { retryCount: 0 });
          const lock = await redlock.acquire([`{r}:${lib.name}:1`, `{r}:${lib.name}:2`], 5000);
          assert.ok(lock.token > 0);
          await lock.release();
        } finally {
          await client.close();
          await lib.close(conn);
        }
      });
    }

    it("leases are ordinary keys of their slot's master", async () => {
      const conn = await LIBS[0].cluster(cluster.ports);
      const client = new LeaseClient(conn);
      try {
        const lease = await client.acquire("{slotcheck}:lock", 5000);
        assert.ok(lease);
        let found = 0;
        for (const port of cluster.ports) {
          const r = await raw(port);
          const info = await leaseInfo(r, "{slotcheck}:lock").catch(() => null);
          if (info) found++;
          r.disconnect();
        }
        assert.equal(found, 1);
        await lease.release();
      } finally {
        await client.close();
        await LIBS[0].close(conn);
      }
    });
  });
}
