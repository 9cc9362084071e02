//! Native lease commands for Redis: LEASE.ACQUIRE, LEASE.RENEW,
//! LEASE.RELEASE, LEASE.FENCE, LEASE.INFO.
//!
//! `lease` is the pure core (no FFI); `module` binds it to the server. This
//! file only registers the module.

#![deny(unsafe_code)]

pub mod lease;
// Unit tests build without the registration below, so the binding is unused there.
#[cfg(feature = "module")]
#[cfg_attr(test, allow(dead_code))]
mod module;

#[cfg(all(feature = "module", not(test)))]
#[allow(unsafe_code)]
mod registration {
    use redis_module::alloc::RedisAlloc;
    use redis_module::redis_module;

    use crate::module::entry::load::init;
    use crate::module::entry::type_methods::LEASE_TYPE;

    redis_module! {
        name: "lease",
        version: crate::module::version::VERSION_NUM,
        allocator: (RedisAlloc, RedisAlloc),
        data_types: [LEASE_TYPE],
        init: init,
    }
}
