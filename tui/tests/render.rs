mod common;
use common::*;

#[test]
fn dump() {
    let mut h = Harness::ready(160, 48);
    h.tel("HWINFO 16 128.0 100.5 0 0.0 AMD EPYC 7B13|");
    h.tel(&emap_line());
    h.send("hello there");
    h.stdout(b"<think>let me see</think>General Kenobi! \xff ok");
    h.tel("LIVE 5 12.50 87.5 1.30 0");
    h.stdout(&turn_bytes(b"", "STAT 12 12.34 87.5 1.31 20 0"));
    h.tel("HITS 4 16 ff00000000000000");
    h.tel("REPIN 3 7 2 12 9 1.5");
    h.tel("DISKCLASS cold 120 2400000000 3.000 2.000 0 warm 30 600000000 0.500 0.400 0");
    for l in h.screen(160, 48) {
        println!("{l}");
    }
    for l in h.screen(80, 24) {
        println!("{l}");
    }
    for l in h.screen(100, 40) {
        println!("{l}");
    }
}
