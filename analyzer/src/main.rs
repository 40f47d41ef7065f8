fn main() {
    println!("vramshim: not yet");
}
