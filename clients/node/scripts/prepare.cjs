// npm's `prepare` script: builds dist/ (the CommonJS build) and the ES
// module declarations of esm/ whenever npm installs this package from a
// directory (`npm install ./clients/node`), a git URL, `npm pack` or
// `npm ci` in it. npm installs a git dependency's devDependencies before
// `prepare`, but not a directory's: when TypeScript is not there, the
// package's own locked devDependencies are installed first (`npm ci
// --ignore-scripts`, from package-lock.json), as npm does for git.
"use strict";
const { execFileSync } = require("node:child_process");
const path = require("node:path");

const dir = path.resolve(__dirname, "..");
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const run = (cmd, args) => execFileSync(cmd, args, { cwd: dir, stdio: "inherit" });

let tsc;
try {
  tsc = require.resolve("typescript/bin/tsc", { paths: [dir] });
} catch {
  console.error("redis-lease: installing its build tools (npm ci --ignore-scripts) to build dist/");
  run(npm, ["ci", "--ignore-scripts", "--no-audit", "--no-fund"]);
  tsc = require.resolve("typescript/bin/tsc", { paths: [dir] });
}
run(process.execPath, [tsc, "-p", "tsconfig.json"]);
run(process.execPath, [tsc, "-p", "tsconfig.esm.json"]);
