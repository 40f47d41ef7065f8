//! Human-facing renderings of reports: text and HTML.

pub mod html;
pub mod text;
