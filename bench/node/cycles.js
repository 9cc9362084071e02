// `make bench`, part J (bench/node.sh): acquire + release cycles per second
// of the Node.js helper (clients/node) against node-redlock and the raw
// commands. Arguments: the port of one master, then the ports of five.
// Every client runs BENCH_MS per run, NODE_REPS runs interleaved; the medians
// and their ratios are printed as a Markdown table. One cycle at a time
// (acquire, then release), a fresh owner per cycle everywhere.
const { randomBytes } = require("node:crypto");
const path = require("node:path");
const lib = path.resolve(__dirname, "../../clients/node");
const Redis = require(path.join(lib, "node_modules/ioredis"));
const NodeRedlock = require(path.join(lib, "node_modules/redlock")).default;
const { LeaseClient, QuorumClient, Redlock } = require(path.join(lib, "dist/src"));

const MS = Number(process.env.BENCH_MS || 2000);
const REPS = Number(process.env.NODE_REPS || 5);

async function timed(cycle) {
  for (let i = 0; i < 200; i++) await cycle(i); // warm-up
  let n = 0;
  const t0 = process.hrtime.bigint();
  const end = Date.now() + MS;
  for (let i = 0; i < 1e8 && Date.now() < end; i++) {
    await cycle(i);
    n++;
  }
  return n / (Number(process.hrtime.bigint() - t0) / 1e9);
}

async function main() {
  const [one, ...five] = process.argv.slice(2).map(Number);
  const c1 = new Redis(one, "127.0.0.1");
  const c5 = five.map((p) => new Redis(p, "127.0.0.1"));
  const client = new LeaseClient(c1);
  const dropin = new Redlock([c1]);
  const theirs = new NodeRedlock([c1]);
  const quorum = new QuorumClient(c5);
  const dropin5 = new Redlock(c5);
  const theirs5 = new NodeRedlock(c5);
  const rows = {
    "raw LEASE.ACQUIRE + LEASE.RELEASE (ioredis, one connection)": async () => {
      const owner = randomBytes(16).toString("hex");
      if ((await c1.call("LEASE.ACQUIRE", "raw", owner, 10000)) === null) throw new Error("busy");
      await c1.call("LEASE.RELEASE", "raw", owner);
    },
    "LeaseClient (acquire + release, watchdog on)": async () => {
      const lease = await client.acquire("helper", 10000);
      await lease.release();
    },
    "Redlock drop-in, one master": async () => {
      const lock = await dropin.acquire(["dropin"], 10000);
      await lock.release();
    },
    "node-redlock 5.0.0-beta.2, one master (no token)": async () => {
      const lock = await theirs.acquire(["theirs"], 10000);
      await lock.release();
    },
    "QuorumClient, five masters": async () => {
      const lease = await quorum.acquire("q-helper", 10000);
      await lease.release();
    },
    "Redlock drop-in, five masters (quorum, token)": async () => {
      const lock = await dropin5.acquire(["q-dropin"], 10000);
      await lock.release();
    },
    "node-redlock 5.0.0-beta.2, five masters (no token)": async () => {
      const lock = await theirs5.acquire(["q-theirs"], 10000);
      await lock.release();
    },
  };
  const results = Object.fromEntries(Object.keys(rows).map((k) => [k, []]));
  for (let r = 0; r < REPS; r++) {
    for (const [name, cycle] of Object.entries(rows)) {
      results[name].push(await timed(cycle));
      process.stderr.write(`run ${r + 1}/${REPS} ${name}: ${results[name][r].toFixed(0)}/s\n`);
    }
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const names = Object.keys(rows);
  const m = Object.fromEntries(names.map((k) => [k, median(results[k])]));
  const raw = m[names[0]];
  const theirs1 = m[names[3]];
  const theirs5m = m[names[6]];
  console.log("| client | cycles/s (median) | vs raw commands | vs node-redlock, same masters |");
  console.log("|---|---:|---:|---:|");
  names.forEach((k, i) => {
    const vsRaw = i < 4 ? (m[k] / raw).toFixed(2) : "";
    const vsTheirs = i === 0 ? "" : (m[k] / (i < 4 ? theirs1 : theirs5m)).toFixed(2);
    console.log(`| ${k} | ${m[k].toFixed(0)} | ${vsRaw} | ${vsTheirs} |`);
  });
  await client.close();
  await quorum.close();
  c1.disconnect();
  c5.forEach((c) => c.disconnect());
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
