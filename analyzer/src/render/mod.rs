//! Human-facing renderings of reports: text and HTML.

pub mod text;
