//! Whose conversation a session holds. Prefix reuse (a session's own history, rows adopted
//! from another session, the slot a prompt is placed on) only ever compares a prompt with
//! histories of the same tenant: otherwise how much of a prompt was "cached", and how fast
//! it was prefilled, tells one client what another has said (a PIN recovered a digit at a
//! time, in about a hundred requests, before this rule).
//!
//! The fronts name the tenant: `serve`, `run` and a key-less API without a `user` are
//! [`Tenant::LOCAL`] (one person's machine); `colibri api` derives one from the API key a
//! request presented and the `user` it gave. A session's tenant is kept beside its saved
//! conversation (`.coli_kv.N.tenant`), so the rule holds across restarts; a conversation
//! saved without one (an older version, `serve`) is the local tenant's.

use std::path::{Path, PathBuf};

/// A tenant's id: a hash of what identifies it, stable across restarts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tenant(pub u64);

impl Tenant {
    /// Whoever runs the daemon or a key-less local API without naming a user.
    pub const LOCAL: Tenant = Tenant(0);

    /// The tenant of `parts` (e.g. the API key, then the client's `user`): a hash that keeps
    /// the parts apart, never [`Tenant::LOCAL`].
    pub fn of(parts: &[&[u8]]) -> Tenant {
        let mut bytes = Vec::new();
        for p in parts {
            bytes.extend_from_slice(&(p.len() as u64).to_le_bytes());
            bytes.extend_from_slice(p);
        }
        match xxhash_rust::xxh3::xxh3_64(&bytes) {
            0 => Tenant(1),
            h => Tenant(h),
        }
    }

    fn path(kv_path: &Path) -> PathBuf {
        let mut name = kv_path.as_os_str().to_owned();
        name.push(".tenant");
        PathBuf::from(name)
    }

    /// The tenant saved beside `kv_path`: [`Tenant::LOCAL`] when there is none, and a tenant
    /// nobody has when the file cannot be read (its conversation is then never reused).
    pub fn load(kv_path: &Path) -> Tenant {
        match std::fs::read_to_string(Self::path(kv_path)) {
            Ok(s) => u64::from_str_radix(s.trim(), 16)
                .map(Tenant)
                .unwrap_or(Tenant(u64::MAX)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Tenant::LOCAL,
            Err(_) => Tenant(u64::MAX),
        }
    }

    /// Saves the tenant beside `kv_path` (crash-safe: the old file or the new, never half).
    pub fn store(self, kv_path: &Path) -> std::io::Result<()> {
        let path = Self::path(kv_path);
        if self == Tenant::LOCAL {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        crate::durable::replace_file(&path, format!("{:016x}\n", self.0).as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_keep_their_parts_apart_and_survive_a_restart() {
        assert_ne!(Tenant::of(&[b"ab", b"c"]), Tenant::of(&[b"a", b"bc"]));
        assert_ne!(Tenant::of(&[b""]), Tenant::LOCAL);
        let dir = std::env::temp_dir().join(format!("colibri-tenant-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kv = dir.join(".coli_kv.3");
        assert_eq!(Tenant::load(&kv), Tenant::LOCAL);
        let t = Tenant::of(&[b"key", b"alice"]);
        t.store(&kv).unwrap();
        assert_eq!(Tenant::load(&kv), t);
        Tenant::LOCAL.store(&kv).unwrap();
        assert_eq!(Tenant::load(&kv), Tenant::LOCAL);
        std::fs::write(Tenant::path(&kv), "not hex").unwrap();
        assert_eq!(Tenant::load(&kv), Tenant(u64::MAX));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
