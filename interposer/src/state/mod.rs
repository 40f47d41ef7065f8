//! What the process holds: the live tables of allocations and handles ([`live_table`]), the
//! call and byte counters ([`counters`]) and their reading for tests and at exit
//! ([`stats`]). Beside `cap`, `pool` and `tracer`: none of the four imports another.

pub(crate) mod counters;
pub(crate) mod live_table;
pub(crate) mod stats;
