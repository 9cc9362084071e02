// The package as its users load it: from an ES module and from CommonJS
// (real .mjs, .cjs and "type": "module" files run by node), typed under
// each of TypeScript's module resolutions (node10, node16, nodenext,
// bundler), installed with `npm install <checkout>` into a fresh project
// (the `prepare` script builds it), packed with the right files, and
// versioned as the module.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";

import { ROOT } from "./servers";

/** The package's directory (this file runs from dist/test). */
const PKG = path.resolve(__dirname, "../..");
const TSC = require.resolve("typescript/bin/tsc", { paths: [PKG] });

function run(cmd: string, args: string[], cwd: string, timeout = 120000): string {
  return execFileSync(cmd, args, { cwd, timeout, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
}

/** A project whose node_modules/redis-lease is this package (a link, as
 * `npm install <dir>` makes), with @types/node for TypeScript. */
function project(): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "lease-node-pkg-"));
  fs.mkdirSync(path.join(dir, "node_modules/@types"), { recursive: true });
  fs.symlinkSync(PKG, path.join(dir, "node_modules/redis-lease"));
  fs.symlinkSync(path.join(PKG, "node_modules/@types/node"), path.join(dir, "node_modules/@types/node"));
  fs.writeFileSync(path.join(dir, "package.json"), JSON.stringify({ name: "app", version: "1.0.0", private: true }));
  return dir;
}

// What each way of loading prints: the same classes, once.
const ESM_CHECK = `
import Redlock, { Redlock as Named, ExecutionError, ResourceLockedError, Lock } from "redis-lease/redlock";
import * as lease from "redis-lease";
import RedlockV4 from "redis-lease/redlock-v4";
import { createRequire } from "node:module";
const cjs = createRequire(import.meta.url)("redis-lease/redlock");
const redlock = new Redlock([{ call() {}, pipeline() {}, isCluster: false }], { retryCount: 0 });
console.log(JSON.stringify({
  constructs: redlock instanceof Named && redlock instanceof lease.Redlock,
  sameAsRequire: Redlock === cjs.default && ExecutionError === cjs.ExecutionError && Lock === cjs.Lock,
  errors: new ExecutionError("x", []) instanceof Error && typeof ResourceLockedError === "function",
  client: typeof lease.LeaseClient,
  v4: typeof RedlockV4 === "function" && typeof RedlockV4.LockError === "function" && typeof RedlockV4.Lock === "function",
}));
`;

const CJS_CHECK = `
const { default: Redlock, Redlock: Named, ExecutionError } = require("redis-lease/redlock");
const lease = require("redis-lease");
const RedlockV4 = require("redis-lease/redlock-v4");
const redlock = new Redlock([{ call() {}, pipeline() {}, isCluster: false }], { retryCount: 0 });
const v4 = new RedlockV4([{ call() {}, pipeline() {}, isCluster: false }]);
console.log(JSON.stringify({
  constructs: redlock instanceof Named && Redlock === lease.Redlock,
  errors: new ExecutionError("x", []) instanceof Error,
  client: typeof lease.LeaseClient,
  v4: v4 instanceof require("node:events").EventEmitter && typeof v4.lock === "function" && RedlockV4.LockError.name === "LockError",
}));
`;

// Type-checked under every resolution: a wrong use must be an error (the
// types are the package's, not `any`).
const TS_CHECK = (v4Import: string): string => `
import Redlock, { ExecutionError, Lock, ResourceLockedError } from "redis-lease/redlock";
import { LeaseClient, Redlock as Named } from "redis-lease";
${v4Import}
const redlock: Redlock = new Redlock([{}], { retryCount: 0 });
export const named: Named = redlock;
export async function token(): Promise<number> {
  const lock: Lock = await redlock.acquire(["a"], 1000);
  await redlock.using(["a"], 1000, async (signal) => signal.aborted);
  return lock.token;
}
export const failure: ExecutionError | ResourceLockedError | null = null;
export const client = LeaseClient;
// @ts-expect-error: a Redlock is not a number
export const wrong: number = new Redlock([{}]);
const v4 = new RedlockV4([{}], { retryCount: 1 });
export const locked: PromiseLike<RedlockV4.Lock> = v4.lock("a", 100);
// @ts-expect-error: lock() takes a ttl
v4.lock("a");
`;

describe("the package as its users load it", () => {
  let dir: string;
  before(() => {
    dir = project();
  });
  after(() => fs.rmSync(dir, { recursive: true, force: true }));

  it("an ES module (.mjs) imports the default, the named exports and v4, the same classes as require", () => {
    fs.writeFileSync(path.join(dir, "check.mjs"), ESM_CHECK);
    assert.deepEqual(JSON.parse(run(process.execPath, ["check.mjs"], dir)), { constructs: true, sameAsRequire: true, errors: true, client: "function", v4: true });
  });

  it('a .js file of a "type": "module" package (node-redlock v5\'s README) imports it', () => {
    const esm = path.join(dir, "esm-app");
    fs.mkdirSync(esm);
    fs.writeFileSync(path.join(esm, "package.json"), JSON.stringify({ type: "module" }));
    fs.writeFileSync(path.join(esm, "check.js"), ESM_CHECK);
    assert.equal(JSON.parse(run(process.execPath, ["check.js"], esm)).constructs, true);
  });

  it("CommonJS (.cjs) requires the default, the named exports and v4", () => {
    fs.writeFileSync(path.join(dir, "check.cjs"), CJS_CHECK);
    assert.deepEqual(JSON.parse(run(process.execPath, ["check.cjs"], dir)), { constructs: true, errors: true, client: "function", v4: true });
  });

  const modes: Array<[string, string, string, string]> = [
    // [module, moduleResolution, file, how v4 is imported]
    ["commonjs", "node10", "node10.ts", 'import RedlockV4 = require("redis-lease/redlock-v4");'],
    ["node16", "node16", "esm.mts", 'import RedlockV4 from "redis-lease/redlock-v4";'],
    ["node16", "node16", "cjs.cts", 'import RedlockV4 = require("redis-lease/redlock-v4");'],
    ["nodenext", "nodenext", "esm.mts", 'import RedlockV4 from "redis-lease/redlock-v4";'],
    ["nodenext", "nodenext", "cjs.cts", 'import RedlockV4 = require("redis-lease/redlock-v4");'],
    ["esnext", "bundler", "bundler.ts", 'import RedlockV4 from "redis-lease/redlock-v4";'],
  ];
  for (const [module, resolution, file, v4] of modes) {
    it(`TypeScript types it under module ${module}, moduleResolution ${resolution} (${file})`, () => {
      const ts = path.join(dir, `ts-${module}-${resolution}-${file.replace(/\W/g, "")}`);
      fs.mkdirSync(ts);
      fs.writeFileSync(path.join(ts, file), TS_CHECK(v4));
      const args = [TSC, "--noEmit", "--strict", "--esModuleInterop", "--skipLibCheck", "false", "--types", "node", "--lib", "es2022,esnext.disposable", "--target", "es2022"];
      try {
        run(process.execPath, [...args, "--module", module, "--moduleResolution", resolution, file], ts);
      } catch (e) {
        assert.fail(`tsc: ${(e as { stdout?: string }).stdout ?? String(e)}`);
      }
    });
  }
});

describe("the package from a checkout", () => {
  let work: string;
  before(() => {
    work = fs.mkdtempSync(path.join(os.tmpdir(), "lease-node-install-"));
  });
  after(() => fs.rmSync(work, { recursive: true, force: true }));

  it("npm install <checkout> builds it (prepare) into a fresh project, which imports and requires it", () => {
    // The checkout's files without dist/ (as git has them), its build tools
    // from this package's node_modules.
    const checkout = path.join(work, "checkout");
    fs.cpSync(PKG, checkout, {
      recursive: true,
      filter: (src) => {
        const rel = path.relative(PKG, src);
        return !/^(dist|node_modules)(\/|$)/.test(rel) && !/^esm\/.*\.d\.ts$/.test(rel);
      },
    });
    fs.symlinkSync(path.join(PKG, "node_modules"), path.join(checkout, "node_modules"));
    const app = path.join(work, "app");
    fs.mkdirSync(app);
    fs.writeFileSync(path.join(app, "package.json"), JSON.stringify({ name: "app", version: "1.0.0", private: true }));
    run("npm", ["install", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error", checkout], app, 300000);
    assert.ok(fs.existsSync(path.join(checkout, "dist/src/redlock.js")), "prepare built dist/");
    assert.ok(fs.existsSync(path.join(checkout, "esm/redlock.d.ts")), "and the ES module declarations");
    fs.writeFileSync(path.join(app, "check.mjs"), ESM_CHECK);
    fs.writeFileSync(path.join(app, "check.cjs"), CJS_CHECK);
    assert.equal(JSON.parse(run(process.execPath, ["check.mjs"], app)).sameAsRequire, true);
    assert.equal(JSON.parse(run(process.execPath, ["check.cjs"], app)).v4, true);
  });

  it("npm pack ships the builds, the ES module entries and their types, not the tests", () => {
    const out = JSON.parse(run("npm", ["pack", "--dry-run", "--json", "--ignore-scripts"], PKG)) as Array<{ files: Array<{ path: string }> }>;
    const files = new Set(out[0].files.map((f) => f.path));
    for (const f of ["dist/src/index.js", "dist/src/redlock.js", "dist/src/redlock.d.ts", "dist/src/redlock-v4.js", "dist/src/redlock-v4.d.ts", "esm/index.js", "esm/redlock.js", "esm/redlock.d.ts", "esm/package.json", "README.md"])
      assert.ok(files.has(f), `${f} is packed`);
    assert.ok(![...files].some((f) => f.startsWith("dist/test/")), "no tests");
  });

  it("its version is the module's (the root Cargo.toml's)", () => {
    const cargo = fs.readFileSync(path.join(ROOT, "Cargo.toml"), "utf8");
    const version = /^version = "(.*)"$/m.exec(cargo)![1];
    assert.equal(JSON.parse(fs.readFileSync(path.join(PKG, "package.json"), "utf8")).version, version);
    assert.equal(JSON.parse(fs.readFileSync(path.join(PKG, "package-lock.json"), "utf8")).version, version);
  });
});
