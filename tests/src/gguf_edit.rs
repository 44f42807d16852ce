//! Byte edits of a GGUF file, for the tests that check a contradicting or unreadable file is
//! refused naming what is wrong. A GGUF string is its u64 length then its bytes; a key is
//! followed by its u32 value type and the value, a tensor's name by its u32 dimension count,
//! the u64 dimensions and its u32 type.

/// Where the value type of metadata key (or the dimension count of tensor) `name` starts.
pub fn after_name(bytes: &[u8], name: &str) -> usize {
    let name = name.as_bytes();
    let at = bytes
        .windows(name.len() + 8)
        .position(|w| w[..8] == (name.len() as u64).to_le_bytes() && &w[8..] == name)
        .unwrap_or_else(|| panic!("{} is not in the file", String::from_utf8_lossy(name)));
    at + 8 + name.len()
}

/// Sets the u32 metadata key `key` from `from` (asserted, with its type) to `to`.
pub fn set_u32_key(bytes: &mut [u8], key: &str, from: u32, to: u32) {
    let ty = after_name(bytes, key);
    assert_eq!(bytes[ty..ty + 4], 4u32.to_le_bytes(), "{key}: not a u32");
    assert_eq!(
        bytes[ty + 4..ty + 8],
        from.to_le_bytes(),
        "{key} before the edit"
    );
    bytes[ty + 4..ty + 8].copy_from_slice(&to.to_le_bytes());
}

/// Retypes tensor `name` from ggml type id `from` (asserted) to `to`.
pub fn retype_tensor(bytes: &mut [u8], name: &str, from: u32, to: u32) {
    let dims_at = after_name(bytes, name);
    let n_dims = u32::from_le_bytes(bytes[dims_at..dims_at + 4].try_into().unwrap()) as usize;
    let ty = dims_at + 4 + 8 * n_dims;
    assert_eq!(
        bytes[ty..ty + 4],
        from.to_le_bytes(),
        "{name}'s type before the edit"
    );
    bytes[ty..ty + 4].copy_from_slice(&to.to_le_bytes());
}
