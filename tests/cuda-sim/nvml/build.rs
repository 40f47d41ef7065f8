fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    // Our own symbols bind inside the library, whatever a preloaded interposer exports.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    // Never unloaded: handles and the mapped device region outlive a dlclose.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
