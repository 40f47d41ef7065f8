fn main() {
    // The real driver's soname: the runtime and cudarc dlopen("libcuda.so.1").
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // Bind our own symbols inside the library, as the real driver does: cuGetProcAddress must
    // hand out the driver's own cuMemAlloc_v2 even when a preloaded interposer exports one
    // (otherwise the interposer's "real" function would be itself).
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    // Never unloaded (as a real driver in practice): stream worker threads and the atexit and
    // atfork handlers point into this library.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
