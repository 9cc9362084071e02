//! The Lua scripts of the client-side recipes.

/// Compare-and-delete, the usual unlock script.
pub const COMPARE_AND_DELETE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                                      return redis.call('DEL', KEYS[1]) end return 0";

/// Compare-and-delete, then wake the waiters (Redisson's unlock does the same:
/// delete and PUBLISH in one script).
pub const COMPARE_AND_DELETE_PUBLISH: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                                              redis.call('DEL', KEYS[1]) \
                                              redis.call('PUBLISH', ARGV[2], ARGV[3]) return 1 end return 0";

/// Fenced write of the Lua recipe: the lock still has the caller's owner,
/// then the write.
pub const FENCED_WRITE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                                return redis.call('SET', KEYS[2], ARGV[2]) end \
                                return redis.error_reply('not the owner')";

/// RedissonLock's lock script (`tryLockInnerAsync`, the same text in
/// Redisson 3.1x to 3.4x): the lock is a hash `KEYS[1]` {lock name: hold
/// count}; free or already ours: count up, `PEXPIRE` to the lease time, and
/// answer nil (taken); else answer the lock's `PTTL`. ARGV[1] is the lease
/// time in ms, ARGV[2] Redisson's lock name (`<client uuid>:<thread id>`).
pub const REDISSON_LOCK: &str = "if ((redis.call('exists', KEYS[1]) == 0) \
                                 or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then \
                                 redis.call('hincrby', KEYS[1], ARGV[2], 1); \
                                 redis.call('pexpire', KEYS[1], ARGV[1]); \
                                 return nil; \
                                 end; \
                                 return redis.call('pttl', KEYS[1]);";

/// RedissonLock's unlock script (`unlockInnerAsync` before the unlock-latch
/// key of later versions): not ours: nil; count down; still held
/// (re-entered): `PEXPIRE` and 0; else `DEL` the lock and `PUBLISH` the
/// unlock message on the lock's channel `KEYS[2]` (what wakes Redisson's
/// waiters), and 1. ARGV[1] is the message (0), ARGV[2] the lease time,
/// ARGV[3] the lock name.
pub const REDISSON_UNLOCK: &str = "if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then \
                                   return nil; \
                                   end; \
                                   local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); \
                                   if (counter > 0) then \
                                   redis.call('pexpire', KEYS[1], ARGV[2]); \
                                   return 0; \
                                   else \
                                   redis.call('del', KEYS[1]); \
                                   redis.call('publish', KEYS[2], ARGV[1]); \
                                   return 1; \
                                   end; \
                                   return nil;";
