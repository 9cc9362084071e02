//! `CONFIG GET/SET lease.<name>` (a setting by its index in
//! `lease::config::SETTINGS`) and the `INFO lease` section.

use crate::lease::config::Name;

use super::super::ffi::entry::{Configs, InfoField};
use super::super::{grace, info, settings};

pub struct Lease;

impl Configs for Lease {
    fn get(index: usize) -> i64 {
        Name::ALL.get(index).map_or(0, |&name| settings::get(name))
    }

    fn set(index: usize, value: i64) {
        if let Some(&name) = Name::ALL.get(index) {
            settings::set(name, value);
            grace::setting_changed(name.setting().on_change);
        }
    }

    fn info() -> Vec<InfoField> {
        info::fields()
    }
}
