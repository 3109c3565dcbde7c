//! Locate: capture paths → workspace files (`paths`), the workspace walk (`workspace`), the one
//! Python scanner (`python`), fix recipes (`edits`) and the step that applies them all to a
//! report (`locate`).

pub mod anchor;
pub mod edits;
pub mod locate;
pub mod paths;
pub mod python;
pub mod workspace;
