fn main() {
    eprintln!("coli: not built yet");
    std::process::exit(1);
}
