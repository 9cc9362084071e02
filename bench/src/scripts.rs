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
