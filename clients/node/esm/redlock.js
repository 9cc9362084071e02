// redis-lease/redlock (the node-redlock v5 drop-in) as an ES module:
// `import Redlock, { ExecutionError } from "redis-lease/redlock"`, as
// node-redlock v5's README imports it. The CommonJS build re-exported: one
// copy of every class whether you import or require it.
import cjs from "../dist/src/redlock.js";

export default cjs.default;
export const { Redlock, Lock, ExecutionError, ResourceLockedError } = cjs;
