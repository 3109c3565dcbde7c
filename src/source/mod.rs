//! Locate: capture paths → workspace files (`paths`), the workspace walk (`workspace`), the one
//! Python scanner (`python`), fix recipes (`edits`, `inference_mode`, `forward_edits`) and the step that applies them all to a
//! report (`locate`).

pub mod anchor;
pub mod edits;
mod forward_edits;
mod inference_mode;
pub mod locate;
pub mod paths;
pub mod python;
pub mod workspace;
