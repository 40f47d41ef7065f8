//! What a Python frame's file and function say about it, as the symbolizer and the
//! PyTorch view both name call sites by the innermost frame of the job's own code.

/// A file of the job's own code: not an installed package, not the standard library, not
/// frozen or generated code.
pub fn is_user_file(file: &str) -> bool {
    !(file.starts_with('<')
        || file.contains("/site-packages/")
        || file.contains("/dist-packages/")
        || is_stdlib(file))
}

fn is_stdlib(file: &str) -> bool {
    // .../lib/python3.X/<module>.py (not .../site-packages, handled above)
    file.split('/')
        .collect::<Vec<_>>()
        .windows(2)
        .any(|w| w[0] == "lib" && w[1].starts_with("python3"))
}

/// `outer.<locals>.<listcomp>` (a comprehension is a function of its own before Python
/// 3.12) is named after the function it is in.
pub fn short_function(f: &str) -> &str {
    match f.find(".<locals>.<") {
        Some(i) => &f[..i],
        None => f,
    }
}
