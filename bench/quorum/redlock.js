// Part G's Node rows (bench/quorum.sh): full lock cycles on the masters
// given as ports (acquire on a majority, one write on the first master,
// release), QUORUM_WARMUP untimed cycles (300) then one after the other
// for QUORUM_MS, then the cycles per second
// and the acquire latency (p50, p99, microseconds) as one JSON line per
// client: node-redlock (no fencing token), the redis-lease drop-in for it
// given several clients (a quorum lease, with a token) and redis-lease's
// QuorumClient (with a token). Every client on ioredis, one connection per
// master. The helpers' write is fenced with the token on the first master that committed it.
const path = require("node:path");
const Redis = require("ioredis");
const NodeRedlock = require("redlock").default;
const lease = require(path.join(__dirname, "../../clients/node/dist/src/index.js"));

async function run(name, acquire, write, release) {
  const ms = Number(process.env.QUORUM_MS || 3000);
  // Untimed cycles first, the same for every client: V8 compiles each
  // client's code while it runs (about 75 us a cycle of the helpers' in a
  // 3 s run, 27 of node-redlock's), which a long-lived process pays once.
  const warmup = Number(process.env.QUORUM_WARMUP ?? 300);
  for (let i = 0; i < warmup; i++) {
    const held = await acquire().catch(() => null);
    if (held) {
      await write(held, i);
      await release(held);
    }
  }
  const lat = [];
  let cycles = 0,
    failed = 0;
  const end = Date.now() + ms;
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < 10000000 && Date.now() < end; i++) {
    const a = process.hrtime.bigint();
    let held;
    try {
      held = await acquire();
    } catch {
      held = null;
    }
    if (!held) {
      failed++;
      continue;
    }
    lat.push(Number(process.hrtime.bigint() - a) / 1000);
    await write(held, i);
    await release(held);
    cycles++;
  }
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  lat.sort((x, y) => x - y);
  const pct = (p) => (lat.length ? lat[Math.min(lat.length - 1, Math.ceil((p / 100) * lat.length) - 1)] : NaN);
  console.log(JSON.stringify({ name, cycles_per_s: cycles / secs, p50_us: pct(50), p99_us: pct(99), failed }));
}

async function main() {
  const ports = process.argv.slice(2).map(Number);
  const connect = () => ports.map((p) => new Redis(p, "127.0.0.1", { maxRetriesPerRequest: 1 }));
  // The helpers' write: fenced, on the first master that committed the
  // token (a step is decided by the first majority: master 0 is not always
  // in it). The drop-in's lock keeps its quorum lease in `held`.
  const fenced = (clients, committed) => (held, i) => clients[committed(held)[0]].call("LEASE.FENCE", "qjob", held.token, "SET", "qdata", String(i));

  let clients = connect();
  const theirs = new NodeRedlock(clients, { retryCount: 0, driftFactor: 0.01 });
  await run(
    "node-redlock 5.0.0-beta.2 (no token)",
    () => theirs.acquire(["qjob"], 10000),
    (lock, i) => clients[0].set("qdata", String(i)),
    (lock) => lock.release(),
  );
  clients.forEach((c) => c.disconnect());

  clients = connect();
  const ours = new lease.Redlock(clients, { retryCount: 0, driftFactor: 0.01 });
  await run("redis-lease Redlock drop-in (Node, 5 masters, with a token)", () => ours.acquire(["qjob"], 10000), fenced(clients, (lock) => lock.held.leases[0].committed), (lock) => lock.release());
  clients.forEach((c) => c.disconnect());

  clients = connect();
  const quorum = new lease.QuorumClient(clients, { watchdog: false });
  await run("redis-lease QuorumClient (Node, with a token)", () => quorum.acquire("qjob", 10000), fenced(clients, (l) => l.committed), (l) => l.release());
  clients.forEach((c) => c.disconnect());
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
