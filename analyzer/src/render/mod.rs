//! Human-facing renderings of reports: text and HTML.

pub mod html;
pub mod text;

pub use crate::terminal::{for_terminal, one_line};
