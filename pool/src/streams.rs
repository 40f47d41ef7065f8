//! The stream a stream-ordered request or free is ordered on, as a pool keys it: one function
//! for the live pool (the interposer, from the call it intercepted) and for `vramshim replay`
//! (from the trace's record of that call), so that the model's cache serves exactly what the
//! live one would. (A request that is not stream-ordered is on [`crate::ANY_STREAM`] for
//! both.)

use crate::Stream;

/// Pool stream ids with this bit are per-thread default streams: `PER_THREAD_BASE | tid`.
pub const PER_THREAD_BASE: Stream = 1 << 62;
/// `CU_STREAM_LEGACY` (`cudaStreamLegacy`): the legacy default stream, handle 0's own.
const CU_STREAM_LEGACY: u64 = 0x1;
/// `CU_STREAM_PER_THREAD` (`cudaStreamPerThread`): the calling thread's default stream.
const CU_STREAM_PER_THREAD: u64 = 0x2;

/// The stream of a stream-ordered call (`cudaMallocAsync`, `cudaFreeAsync` and their driver
/// forms) on handle `stream`, made by the thread `tid` names (asked only for a per-thread
/// stream) through a per-thread entry point (`_ptsz`) or not. Handle 0 means the per-thread
/// default stream when a `_ptsz` entry point was called, and `CU_STREAM_PER_THREAD` always
/// does: each thread's is a different stream, so two threads must not share a free list
/// (reuse "on the same stream" would be unordered).
/// `CU_STREAM_LEGACY` is handle 0's stream.
pub fn ordered_on(stream: u64, per_thread_entry: bool, tid: impl FnOnce() -> u32) -> Stream {
    let per_thread = stream == CU_STREAM_PER_THREAD || (stream == 0 && per_thread_entry);
    if per_thread {
        PER_THREAD_BASE | u64::from(tid())
    } else if stream == CU_STREAM_LEGACY {
        0
    } else {
        stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_stream_handles_are_the_streams_they_name() {
        assert_eq!(ordered_on(0, false, || 9), 0);
        assert_eq!(ordered_on(CU_STREAM_LEGACY, false, || 9), 0);
        assert_eq!(ordered_on(CU_STREAM_LEGACY, true, || 9), 0);
        assert_eq!(ordered_on(0, true, || 9), PER_THREAD_BASE | 9);
        assert_eq!(
            ordered_on(CU_STREAM_PER_THREAD, false, || 9),
            PER_THREAD_BASE | 9
        );
        assert_ne!(
            ordered_on(CU_STREAM_PER_THREAD, false, || 10),
            PER_THREAD_BASE | 9
        );
        assert_eq!(ordered_on(0x7f00_1234, true, || 9), 0x7f00_1234);
    }
}
