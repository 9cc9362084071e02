// Part G's node-redlock row (bench/quorum.sh): full lock cycles on the
// masters given as ports (acquire on a majority, one SET on the first
// master, release), one after the other for QUORUM_MS, then the cycles per
// second and the acquire latency (p50, p99, microseconds) as one JSON line.
// node-redlock gives no fencing token.
const Redis = require("ioredis");
const Redlock = require("redlock").default;

async function main() {
  const ports = process.argv.slice(2).map(Number);
  const ms = Number(process.env.QUORUM_MS || 3000);
  const clients = ports.map((p) => new Redis(p, "127.0.0.1", { maxRetriesPerRequest: 1 }));
  const redlock = new Redlock(clients, { retryCount: 0, driftFactor: 0.01 });
  const lat = [];
  let cycles = 0, failed = 0;
  const end = Date.now() + ms;
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < 10000000 && Date.now() < end; i++) {
    const a = process.hrtime.bigint();
    let lock;
    try {
      lock = await redlock.acquire(["qjob"], 10000);
    } catch (e) {
      failed++;
      continue;
    }
    lat.push(Number(process.hrtime.bigint() - a) / 1000);
    await clients[0].set("qdata", String(i));
    await lock.release();
    cycles++;
  }
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  lat.sort((x, y) => x - y);
  const pct = (p) => (lat.length ? lat[Math.min(lat.length - 1, Math.ceil((p / 100) * lat.length) - 1)] : NaN);
  console.log(JSON.stringify({ name: "node-redlock 5.0.0-beta.2 (no token)", cycles_per_s: cycles / secs, p50_us: pct(50), p99_us: pct(99), failed }));
  clients.forEach((c) => c.disconnect());
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
