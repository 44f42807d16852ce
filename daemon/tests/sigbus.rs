//! A shard cut short while its map is read: the SIGBUS of a page past the new end is absorbed
//! (the page reads zeros) and recorded with the file and offset, which the engine turns into a
//! fatal error after the forward (`weights::sigbus`). The daemons check the shards' lengths
//! before each forward (`weights::in_place`), so only a cut that lands mid-forward gets here:
//! the path is exercised in this process of its own (the fault record is process-wide, and a
//! forward of another test would take it).

use std::os::unix::fs::FileExt;

use colibri::weights::sigbus::take_fault;
use colibri::weights::writer::SafetensorsWriter;
use colibri::weights::{Dtype, ShardSet};

#[test]
fn a_mapped_page_past_a_cut_end_reads_zeros_and_names_the_file() {
    let dir = std::env::temp_dir().join(format!("colibri-sigbus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8 + 1).collect();
    let mut w = SafetensorsWriter::new();
    w.add("t", Dtype::U8, &[data.len()], data.clone());
    let path = dir.join("m.safetensors");
    w.write(&path).unwrap();
    let whole = std::fs::read(&path).unwrap();
    let set = ShardSet::open(std::slice::from_ref(&dir)).unwrap();
    let bytes = set.bytes("t").unwrap();
    assert!(bytes == data.as_slice());
    assert_eq!(take_fault(), None);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(4096).unwrap();
    let last = bytes.len() - 1;
    // SAFETY: `bytes` is a live slice of the shard's map; the page under `last` is past the
    // file's new end, so the read faults, and the handler maps a zero page there before the
    // load completes (what this test checks). Volatile so that the load is made, not taken
    // from the comparison above.
    let v = unsafe { std::ptr::read_volatile(&bytes[last]) };
    assert_eq!(v, 0);
    let fault = take_fault().expect("the fault was recorded");
    assert_eq!(fault.path, path);
    let offset = (whole.len() - data.len() + last) as u64;
    assert_eq!(
        fault.offset, offset,
        "the faulting byte's offset in the file"
    );
    assert_eq!(take_fault(), None, "taken once");
    // Restored, the bytes before the cut are still the file's.
    f.write_all_at(&whole, 0).unwrap();
    assert_eq!(bytes[0], data[0]);
    drop(set);
    std::fs::remove_dir_all(&dir).unwrap();
}
