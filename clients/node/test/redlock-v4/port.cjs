// Preloaded (mocha --require) by run.sh: node-redlock v4's test.js connects
// its clients to the default 127.0.0.1:6379; this points those connections
// at the test server's port (LEASE_V4_PORT) instead, so that the test file
// runs unchanged but for its require, on a server of its own.
"use strict";
const net = require("node:net");
const port = Number(process.env.LEASE_V4_PORT);
if (!port) throw new Error("LEASE_V4_PORT is not set");
for (const name of ["createConnection", "connect"]) {
  const original = net[name];
  net[name] = function (...args) {
    const o = args[0];
    if (o && typeof o === "object" && (o.port === undefined || Number(o.port) === 6379) && !o.path) args[0] = { ...o, port };
    else if (Number(o) === 6379) args[0] = port;
    return original.apply(this, args);
  };
}
