fn main() {
    // The real driver's soname: the runtime and cudarc dlopen("libcuda.so.1").
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
