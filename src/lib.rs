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

    use crate::module::ffi::callbacks::LEASE_TYPE;
    use crate::module::ffi::register::init;

    redis_module! {
        name: "lease",
        version: crate::module::VERSION_NUM,
        allocator: (RedisAlloc, RedisAlloc),
        data_types: [LEASE_TYPE],
        init: init,
    }
}
