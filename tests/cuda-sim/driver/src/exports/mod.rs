//! The exported C entry points, one module per API family. Every function is a real
//! unversioned dynamic symbol, and cuGetProcAddress hands out these same addresses.

pub mod ctx;
pub mod device;
pub mod extra;
pub mod mem;
pub mod memcpy;
pub mod module;
pub mod pool;
pub mod stream;
pub mod streamops;
pub mod vmm;
