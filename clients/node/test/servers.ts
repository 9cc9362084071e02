// Real servers for the tests, each with the module loaded (no mocks): the
// binaries of the test matrix from the Makefile's variables, on free ports.
//
// Environment: LEASE_MODULE (default target/debug/libredis_lease.so),
// REDIS_SERVER (Redis 7.0; default redis-server on PATH), REDIS74_SERVER,
// REDIS80_SERVER, REDIS82_SERVER, VALKEY_SERVER, VALKEY9_SERVER, and
// LEASE_NODE_SERVERS, a comma-separated subset of the kinds (default: every
// one whose binary is there).

import { ChildProcess, execFileSync, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";

import IORedis, { Cluster as IOCluster } from "ioredis";
import { createClient, createCluster } from "redis";

export const ROOT = path.resolve(__dirname, "../../../..");
export const MODULE = process.env.LEASE_MODULE ?? path.join(ROOT, "target/debug/libredis_lease.so");

function onPath(name: string): string | undefined {
  for (const dir of (process.env.PATH ?? "").split(":")) {
    const p = path.join(dir, name);
    if (fs.existsSync(p)) return p;
  }
  return undefined;
}

const BINARIES: Record<string, string | undefined> = {
  redis70: process.env.REDIS_SERVER ?? onPath("redis-server"),
  redis74: process.env.REDIS74_SERVER,
  redis80: process.env.REDIS80_SERVER,
  redis82: process.env.REDIS82_SERVER,
  valkey81: process.env.VALKEY_SERVER,
  valkey91: process.env.VALKEY9_SERVER,
};

/** The server kinds to test on. */
export const KINDS: string[] = (() => {
  const wanted = process.env.LEASE_NODE_SERVERS;
  if (wanted) return wanted.split(",").map((k) => k.trim()).filter(Boolean);
  return Object.keys(BINARIES).filter((k) => BINARIES[k] && fs.existsSync(BINARIES[k]!));
})();

/** Redis 7.4 and 8.0 may run a compatibility subset (design.md S0). */
export const FULL = (kind: string): boolean => kind !== "redis74" && kind !== "redis80";

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Calls `f` every 10 ms until it is true or `withinMs` passed. */
export async function waitUntil(withinMs: number, f: () => boolean | Promise<boolean>): Promise<boolean> {
  const end = Date.now() + withinMs;
  for (let i = 0; i <= withinMs / 10 + 1; i++) {
    if (await f()) return true;
    if (Date.now() >= end) return false;
    await sleep(10);
  }
  return f();
}

/** A free port up to 55535 (a cluster node also listens on port + 10000). */
async function freePort(): Promise<number> {
  for (let i = 0; i < 100; i++) {
    const port = await new Promise<number>((resolve, reject) => {
      const s = net.createServer();
      s.once("error", reject);
      s.listen(0, "127.0.0.1", () => {
        const p = (s.address() as net.AddressInfo).port;
        s.close(() => resolve(p));
      });
    });
    if (port <= 55535) return port;
  }
  throw new Error("no free port up to 55535 in 100 tries");
}

/** One PING over a raw socket: true when the server answers PONG. */
function ping(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(port, "127.0.0.1");
    const done = (ok: boolean): void => {
      s.destroy();
      resolve(ok);
    };
    s.setTimeout(500, () => done(false));
    s.once("error", () => done(false));
    s.once("connect", () => s.write("PING\r\n"));
    s.once("data", (d) => done(d.toString().startsWith("+PONG")));
  });
}

let shim: string | undefined;

/** The LD_PRELOAD clock shim of tests/shim/clockshift.c, compiled once. */
function clockShim(): string {
  if (!shim) {
    const out = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "lease-node-shim-")), "clockshift.so");
    execFileSync("cc", ["-shared", "-fPIC", "-O2", "-o", out, path.join(ROOT, "tests/shim/clockshift.c")], { timeout: 120000 });
    shim = out;
  }
  return shim;
}

export interface ServerOptions {
  extra?: string[];
  /** The module's grace period (ms; 0, off, by default). */
  graceMs?: number;
  /** Its wall clock runs this far ahead (through the clock shim). */
  clockShiftMs?: number;
}

export class Server {
  port = 0;
  readonly dir: string;
  private proc: ChildProcess | undefined;

  private constructor(readonly kind: string) {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), "lease-node-"));
  }

  static async start(kind: string, options: ServerOptions = {}): Promise<Server> {
    if (!fs.existsSync(MODULE)) throw new Error(`module not built at ${MODULE} (cargo build)`);
    const bin = BINARIES[kind];
    if (!bin) throw new Error(`no binary for ${kind}`);
    const s = new Server(kind);
    let env: NodeJS.ProcessEnv | undefined;
    if (options.clockShiftMs !== undefined) {
      const file = path.join(s.dir, "clock-shift");
      const buf = Buffer.alloc(8);
      buf.writeBigInt64LE(BigInt(options.clockShiftMs));
      fs.writeFileSync(file, buf);
      env = { ...process.env, LD_PRELOAD: clockShim(), LEASE_CLOCK_SHIFT_FILE: file };
    }
    let log = "";
    for (let attempt = 0; attempt < 3; attempt++) {
      s.port = await freePort();
      const logfile = path.join(s.dir, `server-${s.port}.log`);
      const proc = spawn(
        bin,
        [
          "--port", String(s.port), "--bind", "127.0.0.1", "--dir", s.dir, "--logfile", logfile,
          "--save", "", "--appendonly", "no",
          // The grace after a start is off in tests (design.md S7).
          "--loadmodule", MODULE, "grace-ms", String(options.graceMs ?? 0),
          ...(options.extra ?? []),
        ],
        { cwd: s.dir, env, stdio: "ignore" },
      );
      s.proc = proc;
      const ok = await waitUntil(20000, async () => proc.exitCode !== null || (await ping(s.port)));
      if (ok && proc.exitCode === null) return s;
      proc.kill("SIGKILL");
      log = fs.existsSync(logfile) ? fs.readFileSync(logfile, "utf8") : "";
    }
    throw new Error(`${kind} server did not start:\n${log}`);
  }

  signal(sig: NodeJS.Signals): void {
    this.proc?.kill(sig);
  }

  async close(): Promise<void> {
    const p = this.proc;
    if (p && p.exitCode === null) {
      p.kill("SIGCONT");
      p.kill("SIGKILL");
      await new Promise((r) => p.once("exit", r));
    }
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

/** A client library under test: how to connect a client to one server or a
 * cluster, and how to close it. */
export interface Lib {
  name: string;
  connect(port: number): Promise<object>;
  cluster(ports: number[]): Promise<object>;
  close(client: object): Promise<void>;
}

/* eslint-disable @typescript-eslint/no-explicit-any */
export const LIBS: Lib[] = [
  {
    name: "ioredis",
    async connect(port) {
      const c = new IORedis(port, "127.0.0.1", { lazyConnect: true });
      await c.connect();
      return c;
    },
    async cluster(ports) {
      const c = new IOCluster(ports.map((port) => ({ host: "127.0.0.1", port })), { lazyConnect: true });
      await c.connect();
      return c;
    },
    async close(c: any) {
      c.disconnect();
    },
  },
  {
    name: "node-redis",
    async connect(port) {
      const c = createClient({ socket: { host: "127.0.0.1", port } });
      c.on("error", () => undefined);
      await c.connect();
      return c;
    },
    async cluster(ports) {
      const c = createCluster({ rootNodes: ports.map((port) => ({ socket: { host: "127.0.0.1", port } })) });
      c.on("error", () => undefined);
      await c.connect();
      return c;
    },
    async close(c: any) {
      await c.close?.().catch?.(() => undefined);
      if (c.isOpen) c.destroy?.();
    },
  },
];

/** A raw connection for checks (ioredis). */
export async function raw(port: number): Promise<IORedis> {
  const c = new IORedis(port, "127.0.0.1", { lazyConnect: true });
  await c.connect();
  return c;
}

/** LEASE.INFO as a map; null when no lease is held. */
export async function leaseInfo(r: IORedis, key: string): Promise<Record<string, unknown> | null> {
  const info = (await r.call("LEASE.INFO", key)) as unknown[] | null;
  if (!info) return null;
  const out: Record<string, unknown> = {};
  for (let i = 0; i + 1 < info.length; i += 2) out[String(info[i])] = info[i + 1];
  return out;
}

/** Three masters with the module, joined by `redis-cli --cluster create`. */
export class ClusterNodes {
  private constructor(readonly nodes: Server[]) {}
  static async start(kind: string): Promise<ClusterNodes> {
    const nodes = await Promise.all(
      [0, 1, 2].map((i) =>
        Server.start(kind, { extra: ["--cluster-enabled", "yes", "--cluster-config-file", `nodes-${i}.conf`, "--cluster-node-timeout", "3000"] }),
      ),
    );
    const c = new ClusterNodes(nodes);
    try {
      execFileSync("redis-cli", ["--cluster", "create", ...nodes.map((n) => `127.0.0.1:${n.port}`), "--cluster-replicas", "0", "--cluster-yes"], {
        timeout: 60000,
        stdio: "pipe",
      });
      for (const n of nodes) {
        const r = await raw(n.port);
        const ok = await waitUntil(20000, async () => {
          const info = String(await r.call("CLUSTER", "INFO"));
          return info.includes("cluster_state:ok") && info.includes("cluster_known_nodes:3");
        });
        r.disconnect();
        if (!ok) throw new Error("the cluster never became ok");
      }
    } catch (e) {
      await c.close();
      throw e;
    }
    return c;
  }
  get ports(): number[] {
    return this.nodes.map((n) => n.port);
  }
  async close(): Promise<void> {
    await Promise.all(this.nodes.map((n) => n.close()));
  }
}

/** A master that accepts no TCP connection: a listener (backlog 1: Node reads 0 as its default, 511) in a
 * child process stopped right after it listens, its queue filled, so that a
 * new connect gets no answer at all (its SYN is dropped) until the client's
 * own timeout. The Python and Rust tests' `Silent`. */
export class Silent {
  private constructor(
    readonly port: number,
    private readonly proc: ChildProcess,
    private readonly queued: net.Socket[],
  ) {}

  static async start(): Promise<Silent> {
    const code =
      'const s = require("net").createServer();' +
      's.listen({ port: 0, host: "127.0.0.1", backlog: 1 }, () => { process.stdout.write(s.address().port + "\\n"); process.kill(process.pid, "SIGSTOP"); });';
    const proc = spawn(process.execPath, ["-e", code], { stdio: ["ignore", "pipe", "ignore"] });
    const port = await new Promise<number>((resolve, reject) => {
      let out = "";
      const timer = setTimeout(() => reject(new Error("the silent listener did not start")), 10000);
      proc.stdout!.on("data", (d: Buffer) => {
        out += d.toString();
        if (out.includes("\n")) {
          clearTimeout(timer);
          resolve(Number(out.trim()));
        }
      });
    });
    // Bounded: 50 connects, the first that gets no answer in 100 ms ends it.
    const queued: net.Socket[] = [];
    for (let i = 0; i < 50; i++) {
      const sock = net.connect(port, "127.0.0.1");
      const ok = await new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => resolve(false), 100);
        sock.once("connect", () => (clearTimeout(timer), resolve(true)));
        sock.once("error", () => (clearTimeout(timer), resolve(false)));
      });
      sock.on("error", () => undefined);
      if (!ok) {
        sock.destroy();
        break;
      }
      queued.push(sock);
    }
    if (queued.length >= 50) throw new Error("the listener's queue never filled");
    return new Silent(port, proc, queued);
  }

  async close(): Promise<void> {
    for (const s of this.queued) s.destroy();
    if (this.proc.exitCode === null) {
      this.proc.kill("SIGKILL");
      await new Promise((r) => this.proc.once("exit", r));
    }
  }
}

/** `calls` of `command` (lower case, `lease.acquire`) in each server's
 * `INFO commandstats` (0: none). */
export async function commandCalls(ports: number[], command: string): Promise<number[]> {
  return Promise.all(
    ports.map(async (port) => {
      const r = await raw(port);
      try {
        const info = String(await r.info("commandstats"));
        const m = new RegExp(`^cmdstat_${command.replace(".", "\\.")}:calls=(\\d+)`, "mi").exec(info);
        return m ? Number(m[1]) : 0;
      } finally {
        r.disconnect();
      }
    }),
  );
}

/** `CONFIG RESETSTAT` on each server. */
export async function resetStats(ports: number[]): Promise<void> {
  await Promise.all(
    ports.map(async (port) => {
      const r = await raw(port);
      await r.config("RESETSTAT");
      r.disconnect();
    }),
  );
}
